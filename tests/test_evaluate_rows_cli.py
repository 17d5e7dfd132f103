"""`evosteer evaluate --rows` (docs/paradigms.md): rows × benchmarks through the evaluate
workflow, the scores table and the token cost table, checked against the stored row tables
with numpy; a bad row name is one line and exit status 2."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_support import isolate_flyte_cache, small_config

from evosteer_core.evaluation.rows import load_row_table, row_rollouts
from evosteer_core.infra.artifacts import ArtifactRef, RunIndex, get_json, open_store
from evosteer_core.infra.runs import record_config, run_id_for
from evosteer_core.pipeline.stage_io import StepStore
from evosteer_core.training.session import init_state, open_session
from evosteer_flyte.cli import main as cli_main

ROWS = "untrained,direct,paradigm:react,paradigm:plan_execute,paradigm:searched"


@pytest.fixture(scope="module")
def step0_run(tmp_path_factory):
    """A run whose only checkpoint is the step-0 state (evaluating it needs no training)."""
    with pytest.MonkeyPatch.context() as mp:
        isolate_flyte_cache(mp, tmp_path_factory.mktemp("home"))
        cfg = small_config(tmp_path_factory.mktemp("run"), **{"sim.n_heldout_per_family": 1})
        store = open_store(cfg.store.root)
        run_id = run_id_for(cfg)
        record_config(store, run_id, cfg)
        state = init_state(cfg)
        RunIndex(store, run_id).record(0, "state", StepStore(store).put_state(state))
        yield cfg, run_id, state


def _argv(cfg, run_id, *extra):
    return ["evaluate", "--run-dir", cfg.store.root, "--run", run_id, "--step", "0", *extra]


def test_rows_table_and_token_costs(step0_run, capsys):
    cfg, run_id, state = step0_run
    argv = _argv(cfg, run_id, "--runs", "2", "--benchmark", "hotpotqa", "--benchmark", "aime")
    argv += ["--rows", ROWS, "--search-candidates", "1", "--search-tasks", "2"]
    assert cli_main(argv) == 0
    text = capsys.readouterr().out
    assert "| row | hotpotqa | aime |" in text and "Tokens per item" in text
    uri = next(line for line in text.splitlines() if line.startswith("Table artifact:"))
    store = open_store(cfg.store.root)
    summary = get_json(store, _ref_from(uri.split(": ", 1)[1]))
    assert [r["row"] for r in summary["rows"]] == ROWS.split(",")
    assert summary["checkpoint"] == RunIndex(store, run_id).lookup(0, "state").sha256
    for r in summary["rows"]:
        assert f"| {r['row']} |" in text
        assert [b["name"] for b in r["benchmarks"]] == ["hotpotqa", "aime"]
        assert all(b["n"] == 2 for b in r["benchmarks"])
    # the direct row is what row_rollouts computes for the same tag (paired seeds)
    session = open_session(cfg, state)
    hotpot = [x for x in session.world.heldout_records if x.family == "hotpotqa"]
    direct = row_rollouts(session, "direct", hotpot, 2, "eval/hotpotqa")
    row = next(r for r in summary["rows"] if r["row"] == "direct")
    means = [direct.loc[direct["run"] == k, "reward"].mean() for k in (0, 1)]
    assert row["benchmarks"][0]["mean"] == pytest.approx(float(np.mean(means)))
    assert row["cost_by_benchmark"]["hotpotqa"]["mean_total"] == pytest.approx(
        float(direct["tokens"].mean())
    )


def test_cost_statistics_equal_numpy_on_the_stored_tables(step0_run, capsys):
    """The row tables the workflow stored (refs in the summary) give the summary's cost
    statistics by a direct numpy computation."""
    cfg, run_id, _ = step0_run
    argv = _argv(cfg, run_id, "--runs", "2", "--benchmark", "nq_open", "--benchmark", "medqa")
    assert cli_main([*argv, "--rows", "direct", "--rows", "paradigm:template"]) == 0
    text = capsys.readouterr().out
    store = open_store(cfg.store.root)
    uri = next(line for line in text.splitlines() if line.startswith("Table artifact:"))
    summary = get_json(store, _ref_from(uri.split(": ", 1)[1]))
    for row in summary["rows"]:
        refs = summary["row_tables"][row["row"]]
        tables = [load_row_table(store, ArtifactRef(**refs[b])) for b in ("nq_open", "medqa")]
        total = np.concatenate([t["tokens"].to_numpy(dtype=float) for t in tables])
        tin = np.concatenate([t["tokens_in"].to_numpy(dtype=float) for t in tables])
        tout = np.concatenate([t["tokens_out"].to_numpy(dtype=float) for t in tables])
        cost = row["cost"]
        assert cost["n"] == len(total) == 4
        assert cost["mean_total"] == pytest.approx(total.mean())
        assert cost["mean_input"] == pytest.approx(tin.mean())
        assert cost["mean_output"] == pytest.approx(tout.mean())
        assert cost["p90"] == pytest.approx(np.percentile(total, 90))
        assert cost["max"] == total.max()
        assert cost["std"] == pytest.approx(np.std(total, ddof=1))
        assert cost["cv"] == pytest.approx(np.std(total, ddof=1) / total.mean())
        means = [t.groupby("run")["reward"].mean().mean() for t in tables]
        assert [b["mean"] for b in row["benchmarks"]] == pytest.approx(means)


def _ref_from(uri):
    return ArtifactRef(sha256=uri.rstrip("/").rsplit("/", 1)[-1], uri=uri)


def test_unknown_row_is_one_line_and_exit_2(step0_run, capsys):
    cfg, run_id, _ = step0_run
    assert cli_main(_argv(cfg, run_id, "--rows", "checkpoint,paradigm:nope")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("evosteer evaluate: --rows: unknown evaluation row 'paradigm:nope'")
