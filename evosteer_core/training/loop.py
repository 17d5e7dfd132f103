"""One whole training step in-process and the plain train loop (no Flyte).

The Flyte workflow runs the same stages as separate, cached tasks through
:mod:`evosteer_core.pipeline.stage_io`; this loop shares one session across the stages of a
step and is what scripts, experiments and tests use.
"""

from __future__ import annotations

from collections.abc import Callable

from evosteer_core.episode.world import build_world
from evosteer_core.infra.config import RunConfig
from evosteer_core.training.session import Session, init_state, open_session
from evosteer_core.training.stages import (
    checkpoint_stage,
    rescore_stage,
    rollout_stage,
    validation_stage,
    value_stage,
)
from evosteer_core.training.state import TrainState
from evosteer_core.training.update import update_stage


def train_step(s: Session, state: TrainState, step: int) -> tuple[TrainState, dict[str, float]]:
    """One full step in-process: the six stages in pipeline order on one session."""
    rollouts = rollout_stage(s, step)
    rescored = rescore_stage(s, rollouts.decisions)
    value = value_stage(s, rollouts, rescored, state.value_window)
    update = update_stage(
        s, rollouts, rescored, state.actor_optimizer, nonfinite_steps=state.nonfinite_steps
    )
    validation = validation_stage(s, rollouts, step)
    new_state = checkpoint_stage(state, step, value, update, validation, seed=s.cfg.train.seed)
    return new_state, {**update.metrics, **value.metrics, **validation.metrics}


def train(
    cfg: RunConfig,
    steps: int | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[TrainState, list[dict[str, float]]]:
    """Plain-Python loop over the configured number of steps (no Flyte)."""
    state = init_state(cfg)
    world = build_world(cfg)
    history = []
    for step in range(1, (steps or cfg.train.steps) + 1):
        s = open_session(cfg, state, world)
        state, metrics = train_step(s, state, step)
        metrics = {k: float(v) for k, v in metrics.items()}
        history.append(metrics)
        if on_step:
            on_step(step, metrics)
    return state, history
