"""Run a fixed paradigm over rollout plans: the episodes the policy would run, driven by the
paradigm instead (same executor behind the same circuit breaker, budget, reward and seeds,
so rows of one evaluation are paired; docs/paradigms.md)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import pandas as pd

from evosteer_core.episode.rollout import (
    EpisodePlan,
    RolloutContext,
    check_health,
    open_episodes,
    run_concurrently,
)
from evosteer_core.episode.runtime import Episode, Evaluator
from evosteer_core.episode.world import World
from evosteer_core.executors.breaker import CircuitBreaker
from evosteer_core.infra.config import RunConfig
from evosteer_core.paradigms.base import Paradigm


def paradigm_context(
    cfg: RunConfig, world: World, run_seed: int, evaluator: Evaluator | None = None
) -> RolloutContext:
    """The rollout context of paradigm episodes outside a session (the offline search):
    the config's budget and breaker settings, no skill menus, no v̂ (a paradigm reads no
    prompt); ``evaluator`` defaults to the world's official reward."""
    return RolloutContext(
        catalogue=world.catalogue,
        limits=cfg.budget,
        executor=world.executor,
        evaluator=evaluator or world.evaluator,
        menus={},
        value_head=None,
        run_seed=run_seed,
        step=0,
        max_consecutive_failures=cfg.executor.max_consecutive_failures,
        min_healthy_fraction=cfg.executor.min_healthy_fraction,
        concurrency=cfg.executor.concurrency,
    )


def run_paradigm(
    paradigm: Paradigm, plans: Sequence[EpisodePlan], ctx: RolloutContext
) -> list[Episode]:
    """Every plan's episode, opened as :func:`episode.rollout.open_episodes` opens the
    policy's and driven to STOP by ``paradigm``; with ``ctx.concurrency`` > 1 that many
    episodes run at once, as one round of the breaker (their outcomes counted in episode
    order). Raises ``ExecutorOutageError`` when too few episodes stayed healthy, as a policy
    rollout does."""
    breaker = CircuitBreaker(ctx.executor, ctx.max_consecutive_failures)
    episodes = open_episodes(plans, ctx, breaker)
    if ctx.concurrency > 1:
        with breaker.round():
            run_concurrently([partial(paradigm.run, ep) for ep in episodes], ctx.concurrency)
    else:
        for ep in episodes:
            paradigm.run(ep)
    health = pd.DataFrame({"healthy": [ep.healthy for ep in episodes]})
    check_health(health, episodes, breaker, ctx, any(p.evaluation for p in plans))
    return episodes
