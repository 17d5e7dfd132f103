"""OOD→IID task-type map and evaluation groups (docs/method.md §1.10, §2.4)."""

from __future__ import annotations

import pytest

from evosteer_core.benchmarks.taskmap import benchmarks_in, family_of, group_of
from evosteer_core.episode.records import FAMILIES


def test_ood_benchmarks_use_matched_iid_type() -> None:
    expected = {
        "musique": "hotpotqa",
        "triviaqa": "nq_open",
        "gpqa": "medqa",
        "math_hard": "aime",
        "swe_bench_verified": "mbpp_plus",
        "webshop": "alfworld",
        "medxpertqa": "medqa",
        "humaneval": "mbpp_plus",
    }
    for benchmark, family in expected.items():
        assert family_of(benchmark) == family
    for family in FAMILIES:
        assert family_of(family) == family


def test_evosteer_groups() -> None:
    assert set(benchmarks_in("iid")) == set(FAMILIES)
    assert set(benchmarks_in("ood")) == {
        "musique",
        "triviaqa",
        "gpqa",
        "math_hard",
        "swe_bench_verified",
        "webshop",
    }
    assert group_of("aime") == "iid" and group_of("webshop") == "ood"
    # every OOD benchmark's task type is an IID benchmark of the same method
    assert {family_of(b) for b in benchmarks_in("ood")} == set(benchmarks_in("iid"))


def test_collabflow_groups_differ() -> None:
    assert group_of("triviaqa", "collabflow") == "iid"
    assert group_of("nq_open", "collabflow") == "ood"
    assert group_of("humaneval", "collabflow") == "ood"
    assert group_of("medxpertqa", "collabflow") == "iid"
    assert len(benchmarks_in("iid", "collabflow")) == len(benchmarks_in("ood", "collabflow")) == 6


def test_unknown_names_fail_clearly() -> None:
    with pytest.raises(KeyError, match="unknown benchmark 'squad'"):
        family_of("squad")
    with pytest.raises(KeyError, match="in no evaluation group"):
        group_of("humaneval")  # not part of EvoSteer's tables
    with pytest.raises(KeyError, match="method 'x'"):
        benchmarks_in("iid", "x")
    with pytest.raises(KeyError, match="group 'test'"):
        benchmarks_in("test")
