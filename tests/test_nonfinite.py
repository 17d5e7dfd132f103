"""Non-finite numbers in the update: a step whose loss or gradient is not finite is skipped
(parameters and optimizer state untouched) and recorded; past ``train.max_nonfinite_steps``
the run stops; the rescored table refuses infinite or NaN log-probs (docs/reliability.md)."""

from __future__ import annotations

import math

import numpy as np
import pandera.pandas as pa
import pytest
import torch

from evosteer_core.infra.config import load_config
from evosteer_core.infra.schemas import validate_rescored
from evosteer_core.training.results import Rescored, Validation, ValueFit
from evosteer_core.training.session import init_state, open_session
from evosteer_core.training.stages import checkpoint_stage, rescore_stage, rollout_stage
from evosteer_core.training.state import TrainState
from evosteer_core.training.update import NonFiniteStepsError, update_stage

SMALL = {
    "train.batch_size": 6,
    "train.rollouts_theta": 1,
    "train.rollouts_rho": 1,
    "budget.max_actions": 4,
    "sim.n_train_per_family": 4,
    "sim.n_heldout_per_family": 2,
    "skills.warmup_steps": 1,
}


@pytest.fixture(scope="module")
def step_one():
    """Config, initial state and the step-1 rollout and rescored tables."""
    torch.set_num_threads(1)
    cfg = load_config(None, overrides=SMALL)
    state = init_state(cfg)
    s = open_session(cfg, state)
    rollouts = rollout_stage(s, step=1)
    return cfg, state, rollouts, rescore_stage(s, rollouts.decisions).table


def _with_logp(step_one, value: float):
    """The rescored table with ℓ_θ of one decision of a scored trajectory set to ``value``."""
    _, _, rollouts, rescored = step_one
    trajectories, decisions = rollouts.trajectories, rollouts.decisions
    ok = trajectories[trajectories["healthy"] & trajectories["complete"]]["traj_id"]
    row = decisions.index[decisions["traj_id"].isin(ok)][0]
    out = rescored.copy()
    out.loc[row, "logp_theta"] = value
    return out


def _update(step_one, rescored, cfg=None, before: int = 0):
    cfg0, state, rollouts, _ = step_one
    s = open_session(cfg or cfg0, state)
    return update_stage(
        s, rollouts, Rescored(rescored), state.actor_optimizer, nonfinite_steps=before
    )


def _same(a, b) -> bool:
    """Equal nested dicts/lists of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_a_finite_step_updates_and_records_no_skip(step_one):
    _, state, _, rescored = step_one
    upd = _update(step_one, rescored)
    assert upd.metrics["nonfinite_skipped"] == 0.0 and upd.nonfinite_steps == 0
    assert math.isfinite(upd.metrics["loss"]) and math.isfinite(upd.metrics["grad_norm"])
    assert not _same(upd.adapter, state.adapter)


@pytest.mark.parametrize("huge", [-1e25, -1e300], ids=["loss-overflows", "beyond-float32"])
def test_a_huge_finite_delta_skips_the_update_and_leaves_the_state_untouched(step_one, huge):
    """Δℓ = -1e25 squares past float32 (loss = inf); -1e300 is beyond float32 altogether."""
    _, state, _, _ = step_one
    upd = _update(step_one, _with_logp(step_one, huge))
    metrics = upd.metrics
    assert not math.isfinite(metrics["loss"]) or not math.isfinite(metrics["grad_norm"])
    assert metrics["nonfinite_skipped"] == 1.0 and metrics["nonfinite_steps"] == 1.0
    assert upd.nonfinite_steps == 1
    assert _same(upd.adapter, state.adapter)
    assert _same(upd.flow_head, state.flow_head)
    assert _same(upd.actor_optimizer, state.actor_optimizer)
    # the measured statistics are recorded all the same (they do not depend on Δℓ)
    assert upd.pool != state.pool
    value = ValueFit(state.value_head, state.outcome_heads, [], {})
    nxt = checkpoint_stage(state, 1, value, upd, Validation(state.skills, {}), seed=42)
    assert TrainState.from_bytes(nxt.to_bytes()).nonfinite_steps == 1


def test_past_the_limit_the_run_stops_naming_the_step_and_the_key(step_one):
    cfg, *_ = step_one
    bad = _with_logp(step_one, -1e25)
    limit = cfg.train.max_nonfinite_steps
    assert _update(step_one, bad, before=limit - 1).nonfinite_steps == limit
    with pytest.raises(NonFiniteStepsError, match=r"^step 1: non-finite loss .*") as info:
        _update(step_one, bad, before=limit)
    assert f"train.max_nonfinite_steps = {limit}" in str(info.value)
    strict = load_config(None, overrides={**SMALL, "train.max_nonfinite_steps": 0})
    with pytest.raises(NonFiniteStepsError, match="train.max_nonfinite_steps = 0"):
        _update(step_one, bad, cfg=strict)


@pytest.mark.parametrize("value", [-np.inf, np.nan], ids=["-inf", "nan"])
def test_the_rescored_schema_requires_finite_log_probs(step_one, value):
    _, _, rollouts, _ = step_one
    with pytest.raises(pa.errors.SchemaErrors, match="logp_theta"):
        validate_rescored(rollouts.decisions, _with_logp(step_one, value))


def test_max_nonfinite_steps_is_a_checked_config_key():
    from evosteer_core.infra.configio import ConfigError

    with pytest.raises(ConfigError, match=r"train.*max_nonfinite_steps: must be >= 0, got -1"):
        load_config(None, overrides={"train.max_nonfinite_steps": -1})


def test_the_count_is_carried_in_the_state_and_the_next_one_stops_the_run(step_one, tmp_path):
    """Through the artifact stages the Flyte tasks run, with ``max_nonfinite_steps`` 1: the
    first skipped update is counted in the next train state, the second stops the run."""
    from evosteer_core.infra.artifacts import open_store
    from evosteer_core.pipeline import stage_io

    _, state, rollouts, _ = step_one
    cfg = load_config(None, overrides={**SMALL, "train.max_nonfinite_steps": 1})
    io_ = stage_io.StepStore(open_store(str(tmp_path / "store")))
    tables = {
        "trajectories": io_.put_table(rollouts.trajectories, "trajectories"),
        "decisions": io_.put_table(rollouts.decisions, "decisions"),
        "rescored": io_.put_table(_with_logp(step_one, -1e25), "rescored"),
    }
    heads = {"value_head": state.value_head, "outcome_heads": state.outcome_heads}
    value = io_.put_object({**heads, "window": [], "metrics": {}}, "value.pt")
    skills = io_.put_object({"skills": state.skills, "metrics": {}}, "skills.pt")
    before = io_.put_state(state)
    (update,) = stage_io.run_stage(cfg, io_, "update", before, 1, tables).values()
    assert io_.get_object(update)["metrics"]["nonfinite_skipped"] == 1.0
    written = {"value": value, "update": update, "skills": skills}
    after = stage_io.run_stage(cfg, io_, "checkpoint", before, 1, written)["state"]
    assert io_.get_state(after).nonfinite_steps == 1
    with pytest.raises(NonFiniteStepsError, match=r"^step 1: .* 2 such steps in this run exceed"):
        stage_io.run_stage(cfg, io_, "update", after, 2, tables)
