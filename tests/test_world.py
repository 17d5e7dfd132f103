"""Where a run's task records come from: the sim suite or benchmark slices."""

from __future__ import annotations

import pytest

from evosteer_core.episode.world import build_world, load_records
from evosteer_core.infra.config import load_config


def test_default_world_is_the_sim_suite_with_disjoint_splits():
    world = build_world(load_config(None, overrides={"sim.n_train_per_family": 3}))
    assert {r.source for r in world.train_records} == {"sim"}
    assert len(world.train_records) == 18
    assert not {r.record_id for r in world.train_records} & {
        r.record_id for r in world.heldout_records
    }


def test_benchmark_slices_load_humaneval_without_overlap():
    train, heldout = load_records(load_config("configs/cpu-smollm2.yaml"))
    assert len(train) == 120 and len(heldout) == 44
    assert train[0].record_id != heldout[0].record_id
    assert {r.metric for r in train} == {"code"}


def test_overlapping_slices_are_rejected():
    cfg = load_config(
        "configs/cpu-smollm2.yaml",
        overrides={
            "data.heldout": [{"name": "humaneval", "offset": 100, "limit": 30}],
        },
    )
    with pytest.raises(ValueError, match="overlap"):
        build_world(cfg)


def test_sim_orchestration_effect_reaches_the_executor():
    plain = build_world(load_config(None, overrides={"sim.n_train_per_family": 1}))
    strong = build_world(
        load_config(None, overrides={"sim.n_train_per_family": 1, "sim.orchestration_effect": 3})
    )
    assert strong.executor.model == plain.executor.model.with_orchestration_effect(3.0)
    assert strong.executor.model != plain.executor.model
    with pytest.raises(ValueError, match="orchestration_effect"):
        load_config(None, overrides={"sim.orchestration_effect": -1})
