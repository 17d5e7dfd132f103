"""Evaluation table: means, sample std (ddof 1) and group std sqrt(Σσ_b²)/n, checked against
numpy/statistics computations."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from evosteer_core.benchmarks.taskmap import benchmarks_in
from evosteer_core.evaluation.tables import benchmark_score, group_score, summarize

IID = benchmarks_in("iid")


def test_benchmark_score_is_mean_and_sample_std():
    runs = [0.2, 0.5, 0.4, 0.9, 0.7]
    s = benchmark_score("aime", runs)
    assert s.mean == pytest.approx(float(np.mean(runs)))
    assert s.std == pytest.approx(statistics.stdev(runs))
    assert s.std == pytest.approx(float(np.std(runs, ddof=1)))
    assert s.n == 5
    assert benchmark_score("aime", [0.3]).std == 0.0


def test_group_average_and_group_std():
    rng = np.random.default_rng(0)
    runs = {b: rng.uniform(size=5).tolist() for b in IID}
    table = summarize(runs)
    assert [s.name for s in table.benchmarks] == list(IID)
    (iid,) = table.groups
    means = [np.mean(runs[b]) for b in IID]
    stds = [np.std(runs[b], ddof=1) for b in IID]
    assert iid.name == "iid avg" and iid.n == 6
    assert iid.mean == pytest.approx(float(np.mean(means)))
    assert iid.std == pytest.approx(math.sqrt(sum(s * s for s in stds)) / 6)
    assert group_score("x", table.benchmarks).std == pytest.approx(iid.std)


def test_incomplete_groups_are_left_out_and_unknown_benchmarks_fail():
    table = summarize({"hotpotqa": [1.0, 0.0], "musique": [0.5, 0.5]})
    assert table.groups == ()
    with pytest.raises(KeyError, match="unknown benchmark 'squad'"):
        summarize({"squad": [1.0]})
    with pytest.raises(ValueError, match="no runs"):
        benchmark_score("aime", [])


def test_a_benchmark_outside_the_methods_groups_is_its_own_row():
    """HumanEval is CollabFlow's OOD set, in no EvoSteer group: it is reported under its own
    name (it used to raise "no evaluation group") and enters no group average."""
    runs = {b: [0.5, 0.25] for b in IID} | {"humaneval": [0.1, 0.0, 0.2]}
    table = summarize(runs)
    humaneval = table.benchmarks[-1]
    assert (humaneval.name, humaneval.n) == ("humaneval", 3)
    assert humaneval.mean == pytest.approx(statistics.mean([0.1, 0.0, 0.2]))
    assert humaneval.std == pytest.approx(statistics.stdev([0.1, 0.0, 0.2]))
    (iid,) = table.groups
    assert iid.n == 6 and iid.mean == pytest.approx(0.375)  # HumanEval is not averaged in
    alone = summarize({"humaneval": [0.0]})
    assert [s.name for s in alone.benchmarks] == ["humaneval"] and alone.groups == ()
    assert summarize({"humaneval": [1.0]}, "collabflow").groups == ()  # its OOD group is partial


def test_table_renders_percentages():
    table = summarize({b: [0.5, 0.5] for b in IID})
    md = table.markdown()
    assert "| hotpotqa | 50.00 | 0.00 | 2 |" in md and "| iid avg | 50.00 | 0.00 | 6 |" in md
    assert table.to_dict()["groups"][0]["name"] == "iid avg"
