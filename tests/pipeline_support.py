"""Shared helpers of the pipeline tests: the smallest tiny-sim settings, an isolated flytekit
local cache, and counters of how often each core stage really ran."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from flytekit.core.local_cache import LocalTaskCache

from evosteer_core.infra.config import RunConfig, load_config
from evosteer_core.pipeline import stage_io

SMALL = {
    "train.batch_size": 6,
    "train.rollouts_theta": 1,
    "train.rollouts_rho": 1,
    "train.value_fit_steps": 5,
    "sim.n_train_per_family": 4,
    "sim.n_heldout_per_family": 2,
    "skills.warmup_steps": 1,
    "budget.max_actions": 4,
}
"""The smallest tiny-sim run that still exercises every stage (about 25 s a step on 2 cores)."""

STAGES = (
    "rollout_stage",
    "rescore_stage",
    "value_stage",
    "update_stage",
    "validation_stage",
    "checkpoint_stage",
)


def small_config(root: Path | str, **extra) -> RunConfig:
    return load_config(None, {**SMALL, "store.root": str(root), **extra})


def isolate_flyte_cache(mp: pytest.MonkeyPatch, home: Path) -> None:
    """flytekit keeps its local cache in ``~/.flyte/local-cache`` (diskcache expands ``~`` when
    the cache is first opened): point HOME elsewhere and make flytekit reopen it."""
    mp.setenv("HOME", str(home))
    mp.setattr(LocalTaskCache, "_initialized", False)


def count_stage_calls(mp: pytest.MonkeyPatch) -> Counter:
    """Wrap the core stages (as the stage table calls them) so that each real (non-cached)
    execution is counted by step."""
    calls: Counter = Counter()

    def wrap(name):
        original = getattr(stage_io, name)

        def counted(*args, **kwargs):
            step = kwargs.get("step", next((a for a in args[1:] if isinstance(a, int)), None))
            calls[(name, step)] += 1
            return original(*args, **kwargs)

        return counted

    for name in STAGES:
        mp.setattr(stage_io, name, wrap(name))
    return calls
