"""Evaluation rows (docs/paradigms.md): the checkpoint row is today's evaluation, rows of one
tag are paired (shared seeds), token columns split the ledger, and the cost table's
statistics match a direct numpy computation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from evosteer_core.evaluation.costs import cost_markdown, table_cost, token_cost
from evosteer_core.evaluation.rollouts import evaluate_policy
from evosteer_core.evaluation.row_summary import row_metrics, scores_markdown, summarize_rows
from evosteer_core.evaluation.rows import (
    COLUMNS,
    ROWS,
    RowError,
    load_row_table,
    parse_rows,
    row_rollouts,
    run_means,
    store_row_table,
)
from evosteer_core.infra.artifacts import LocalStore
from evosteer_core.infra.config import load_config
from evosteer_core.paradigms.searched import SearchSettings, search_workflows
from evosteer_core.training.session import init_state, open_session

CFG = load_config(
    None, {"sim.n_train_per_family": 4, "sim.n_heldout_per_family": 1, "budget.max_actions": 4}
)


@pytest.fixture(scope="module")
def session():
    return open_session(CFG, init_state(CFG))


def test_parse_rows():
    assert parse_rows(["checkpoint,paradigm:react", " direct ,checkpoint", ""]) == [
        "checkpoint",
        "paradigm:react",
        "direct",
    ]
    assert set(ROWS) >= {"checkpoint", "untrained", "direct", "paradigm:searched"}
    with pytest.raises(RowError, match="unknown evaluation row 'paradigm:x'; known: checkpoint"):
        parse_rows(["paradigm:x"])


def test_checkpoint_row_is_todays_evaluation_and_rows_are_paired(session):
    records = session.world.heldout_records[2:4]  # medqa, aime: keeps the policy test short
    ck = row_rollouts(session, "checkpoint", records, 2, "eval/t")
    assert list(ck.columns) == list(COLUMNS) and len(ck) == 2 * len(records)
    old = [evaluate_policy(session, records, True, 1, f"eval/t/{k}") for k in range(2)]
    assert run_means(ck) == old
    # step 0: the adapter is zero, so θ = ρ and the paired rows are identical draw for draw
    un = row_rollouts(session, "untrained", records, 2, "eval/t")
    cols = [c for c in COLUMNS if c != "row"]
    pd.testing.assert_frame_equal(ck[cols], un[cols])
    assert (ck["orchestrator_tokens_in"] > 0).all()
    for table in (ck, un):
        assert (
            table["executor_tokens_in"] + table["orchestrator_tokens_in"] == table["tokens_in"]
        ).all()
        assert (table["tokens_in"] + table["tokens_out"] == table["tokens"]).all()
    # another tag, other seeds
    assert not row_rollouts(session, "checkpoint", records, 1, "eval/u")[cols].equals(ck[cols][:2])


def test_paradigm_rows_are_paired_and_charge_no_orchestrator(session):
    records = session.world.heldout_records
    searched = search_workflows(
        CFG, session.world.train_records, SearchSettings(candidates=1, tasks_per_family=2)
    )
    for row in ROWS[2:]:
        a = row_rollouts(session, row, records, 2, "eval/p", searched)
        b = row_rollouts(session, row, records, 2, "eval/p", searched)
        pd.testing.assert_frame_equal(a, b)
        assert (a["orchestrator_tokens_in"] == 0).all() and (
            a["orchestrator_tokens_out"] == 0
        ).all()
        assert (a["executor_tokens_out"] == a["tokens_out"]).all()
        assert a["healthy"].all() and a["complete"].all()
        assert list(a["run"]) == [0] * len(records) + [1] * len(records)
    with pytest.raises(ValueError, match="needs the result of search_workflows"):
        row_rollouts(session, "paradigm:searched", records, 1, "eval/p")


def test_row_table_round_trips_through_the_store(session, tmp_path):
    table = row_rollouts(session, "direct", session.world.heldout_records, 1, "eval/s")
    store = LocalStore(tmp_path)
    ref = store_row_table(store, table)
    pd.testing.assert_frame_equal(load_row_table(store, ref), table)
    assert store_row_table(store, table) == ref


def test_cost_statistics_match_numpy():
    rng = np.random.default_rng(3)
    tin = rng.integers(100, 5000, size=37)
    tout = rng.integers(10, 900, size=37)
    total = tin + tout
    c = token_cost("x", total.tolist(), tin.tolist(), tout.tolist())
    assert c.n == 37
    assert c.mean_total == pytest.approx(float(np.mean(total)))
    assert c.mean_input == pytest.approx(float(np.mean(tin)))
    assert c.mean_output == pytest.approx(float(np.mean(tout)))
    assert c.p90 == pytest.approx(float(np.percentile(total, 90)))
    assert c.max == float(np.max(total))
    assert c.std == pytest.approx(float(np.std(total, ddof=1)))
    assert c.cv == pytest.approx(float(np.std(total, ddof=1) / np.mean(total)))
    one = token_cost("y", [7.0], [5.0], [2.0])
    assert (one.p90, one.std, one.cv, one.max) == (7.0, 0.0, 0.0, 7.0)
    zero = token_cost("z", [0.0, 0.0], [0.0, 0.0], [0.0, 0.0])
    assert zero.cv == 0.0
    with pytest.raises(ValueError, match="one total, input and output"):
        token_cost("w", [], [], [])
    table = pd.DataFrame({"tokens": total, "tokens_in": tin, "tokens_out": tout})
    assert table_cost("x", table) == c
    md = cost_markdown([c])
    assert md.splitlines()[2].startswith(f"| x | 37 | {np.mean(total):.1f} |")


def _synthetic(rewards: list[list[float]], tokens: int) -> pd.DataFrame:
    rows = [
        {"run": k, "reward": r, "tokens": tokens, "tokens_in": tokens - 10, "tokens_out": 10}
        for k, run in enumerate(rewards)
        for r in run
    ]
    return pd.DataFrame(rows)


def test_row_summary_scores_costs_and_metric_names():
    tables = {
        "checkpoint": {"hotpotqa": _synthetic([[1, 0], [1, 1]], 100)},
        "paradigm:react": {"hotpotqa": _synthetic([[0, 0], [1, 0]], 40)},
    }
    summary = summarize_rows(tables)
    ck, react = summary["rows"]
    assert ck["benchmarks"][0]["mean"] == pytest.approx(np.mean([0.5, 1.0]))
    assert ck["benchmarks"][0]["std"] == pytest.approx(np.std([0.5, 1.0], ddof=1))
    assert react["cost"]["mean_total"] == 40 and react["cost"]["n"] == 4
    md = scores_markdown(summary)
    assert md.splitlines()[0] == "| row | hotpotqa |"
    assert "| checkpoint | 75.00 ± 35.36 |" in md and "| paradigm:react | 25.00 ± 35.36 |" in md
    metrics = row_metrics(summary)
    assert metrics["checkpoint"]["eval.hotpotqa.mean"] == pytest.approx(0.75)
    assert metrics["paradigm:react"]["eval.paradigm.react.hotpotqa.mean"] == pytest.approx(0.25)
    assert metrics["paradigm:react"]["eval.paradigm.react.tokens_per_item"] == 40
