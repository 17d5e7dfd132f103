"""Every objective of the comparison runs a real training step through the one update path:
one in-process tiny-sim step each (same seeds), its own learned state trained, carried in the
train state and in the optimizer, and the cost figures logged when asked for."""

from __future__ import annotations

import math

import pytest
import torch
from pipeline_support import SMALL

from evosteer_core.infra.config import load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.training.loop import train_step
from evosteer_core.training.session import init_state, open_session
from evosteer_core.training.state import TrainState

OWN_STATE = {
    "ppo": {"critic.net.0.weight", "critic.net.0.bias", "critic.net.2.weight", "critic.net.2.bias"},
    "grpo": set(),
    "tempered_tb": {"log_z", "kind_logits"},
}
METRICS = {
    "ppo": ("policy_loss", "value_loss", "entropy", "clip_fraction", "mean_ratio"),
    "grpo": ("policy_loss", "kl", "clip_fraction", "zero_advantage_groups"),
    "tempered_tb": ("log_z", "mean_abs_residual", "mean_log_pb"),
}


@pytest.mark.parametrize("name", sorted(OWN_STATE))
def test_one_step_per_objective(tmp_path, name):
    torch.set_num_threads(1)
    overrides = {
        **SMALL,
        "store.root": str(tmp_path),
        "train.objective": name,
        "train.rollouts_theta": 2,
        "objectives.cost_metrics": True,
    }
    cfg = load_config(None, overrides=overrides)
    state = init_state(cfg)
    assert set(state.objective) == OWN_STATE[name]
    groups = 3 if OWN_STATE[name] else 2
    assert len(state.actor_optimizer["param_groups"]) == groups
    new, metrics = train_step(open_session(cfg, state), state, 1)
    assert math.isfinite(metrics["loss"]) and metrics["nonfinite_skipped"] == 0.0
    for key in (*METRICS[name], "update_ms", "update_ms_per_episode", "tokens_per_problem"):
        assert math.isfinite(metrics[key]), key
    assert metrics["update_ms_per_episode"] > 0 and metrics["tokens_per_problem"] > 0
    changed = [k for k in new.objective if not torch.equal(new.objective[k], state.objective[k])]
    if name == "ppo":  # the critic's zero-initialised output layer moved
        assert "critic.net.2.weight" in changed
    if name == "tempered_tb":
        assert "log_z" in changed
    assert new.adapter.keys() == state.adapter.keys()
    assert any(not torch.equal(new.adapter[k], state.adapter[k]) for k in new.adapter)
    again = TrainState.from_bytes(new.to_bytes())
    reopened = open_session(cfg, again).objective.state_dict()
    assert all(torch.equal(reopened[k], v) for k, v in new.objective.items())


def test_grpo_needs_a_group_of_two():
    with pytest.raises(ConfigError, match=r"train.rollouts_theta: objective 'grpo'.*at least 2"):
        load_config(None, overrides={"train.objective": "grpo", "train.rollouts_theta": 1})
