"""``train.objective`` chooses the objective, and the objective owns its gradient plumbing:
TB (learned log Z) trains through the same update as AnchorTB, with log Z in the optimizer and
carried from step to step in the train state."""

from __future__ import annotations

import pytest
import torch
from pipeline_support import SMALL

from evosteer_core.infra.config import load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.objectives import AnchorTB, TrajectoryBalance
from evosteer_core.training.loop import train_step
from evosteer_core.training.session import init_state, open_session
from evosteer_core.training.state import TrainState


def test_an_unknown_objective_is_one_clear_config_error():
    with pytest.raises(
        ConfigError,
        match=r"train.*objective: expected one of "
        r"\['anchortb', 'ctb', 'grpo', 'ppo', 'tb', 'tempered_tb'\], got 'nope'",
    ):
        load_config(None, overrides={"train.objective": "nope"})


def test_ctb_is_collabflow_s_objective():
    with pytest.raises(ConfigError, match=r"train.objective: ctb .*set method: collabflow"):
        load_config(None, overrides={"train.objective": "ctb"})


def test_the_session_builds_the_configured_objective():
    cfg = load_config(None, overrides={**SMALL, "train.objective": "tb", "train.beta": 1.5})
    s = open_session(cfg, init_state(cfg))
    assert isinstance(s.objective, TrajectoryBalance)
    anchored = load_config(None, overrides={**SMALL, "train.beta": 1.5})
    objective = open_session(anchored, init_state(anchored)).objective
    assert isinstance(objective, AnchorTB) and objective.beta == 1.5


def test_tb_learns_log_z_and_carries_it_in_the_state():
    torch.set_num_threads(1)
    cfg = load_config(None, overrides={**SMALL, "train.objective": "tb"})
    state = init_state(cfg)
    assert state.objective == {"log_z": torch.tensor(0.0)}
    state, metrics = train_step(open_session(cfg, state), state, 1)
    log_z = state.objective["log_z"]
    # one AdamW step moves log Z by about the heads' learning rate, in the residual's direction
    assert log_z != 0.0 and abs(float(log_z)) == pytest.approx(cfg.train.heads.lr, rel=0.05)
    assert metrics["log_z"] == 0.0  # the loss was computed before the step
    again = TrainState.from_bytes(state.to_bytes())
    assert torch.equal(again.objective["log_z"], log_z)
    assert float(open_session(cfg, again).objective.log_z) == float(log_z)
    assert len(state.actor_optimizer["param_groups"]) == 3  # LoRA, b_ψ, log Z


def test_an_objective_without_learned_state_writes_none():
    """AnchorTB has no parameters: its states and updates keep the bytes they had before the
    objective became configurable (the golden-hash test pins them)."""
    cfg = load_config(None, overrides=SMALL)
    state = init_state(cfg)
    assert state.objective == {}
    data = torch.load(__import__("io").BytesIO(state.to_bytes()), weights_only=False)
    assert "objective" not in data
    assert len(state.actor_optimizer["param_groups"]) == 2


def test_a_state_made_with_another_beta_is_refused_in_one_line():
    """The config decides every constant: a state whose anchor statistics were gathered under
    another β (or shrinkage constant) is refused, naming the key, never silently continued."""
    from evosteer_core.training.session import CheckpointMismatchError

    cfg = load_config(None, overrides=SMALL)
    state = init_state(cfg)
    open_session(cfg, state)  # the same constants: fine
    for key, value, named in [
        ("train.beta", 1.5, "train.beta = 2.0, the config says 1.5"),
        ("anchors.n0", 4, "anchors.n0 = 8, the config says 4"),
    ]:
        other = load_config(None, overrides={**SMALL, key: value})
        with pytest.raises(CheckpointMismatchError, match=f"step 0 was made with {named}"):
            open_session(other, state)
