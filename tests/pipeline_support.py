"""Shared helpers of the pipeline tests: the smallest tiny-sim settings, an isolated flytekit
local cache, counters of how often each core stage really ran, and a recorded run written
without training (what the report reads)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd
import pytest
from flytekit.core.local_cache import LocalTaskCache

from evosteer_core.infra.artifacts import LocalStore, RunIndex
from evosteer_core.infra.config import RunConfig, load_config
from evosteer_core.infra.model_cache import cache_root
from evosteer_core.infra.runs import record_config, record_provenance, run_id_for
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
    the cache is first opened): point HOME elsewhere and make flytekit reopen it. The model
    cache stays where it was (converting SmolLM2 again would cost each test ~30 s)."""
    mp.setenv("EVOSTEER_CACHE", str(cache_root()))
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


StepMetrics = Callable[[int], Mapping[str, Mapping[str, float]]]
"""step → the metrics of its ``value``, ``update`` and ``skills`` artifacts."""


def few_metrics(step: int) -> Mapping[str, Mapping[str, float]]:
    return {
        "value": {"value_mse": 0.5 / step},
        "update": {"loss": 2.0 / step, "anchor_only_loss": 1.5},
        "skills": {"skills_candidate": step, "alpha_spent": 0.1 * step},
    }


def recorded_run(
    root: Path,
    steps: int = 2,
    metrics: StepMetrics = few_metrics,
    mlflow: Mapping[str, str] | None = None,
    **overrides,
) -> tuple[RunConfig, str]:
    """A run dir holding a recorded config and provenance (``mlflow`` as the MLflow location)
    and ``steps`` steps whose artifacts are written as the stages write them (every
    ``STEP_ARTIFACTS`` entry; the value, update and skills objects carry ``metrics(step)``),
    without training: what ``report`` and the record task read. The config and its run id."""
    cfg = load_config(None, {"store.root": str(root), **overrides})
    store = LocalStore(root)
    run_id = run_id_for(cfg)
    record_config(store, run_id, cfg)
    record_provenance(store, run_id, mlflow)
    io_ = stage_io.StepStore(store)
    index = RunIndex(store, run_id)
    index.record(0, "state", store.put_bytes(b"initial state", "state"))
    for step in range(1, steps + 1):
        table = io_.put_table(pd.DataFrame({"healthy": [True, step % 3 != 0]}), "t")
        index.record(step, "trajectories", table)
        for name in ("decisions", "rescored", "state"):
            index.record(step, name, store.put_bytes(f"{name} {step}".encode(), name))
        for name, values in metrics(step).items():
            index.record(step, name, io_.put_object({"metrics": dict(values)}, f"{name}.pt"))
    return cfg, run_id


def assert_states_save_as_asdict(root: str | Path, run_id: str) -> int:
    """Every state the run recorded has the bytes of ``torch.save`` of its fields through
    ``dataclasses.asdict`` (the deep copy ``TrainState.to_bytes`` no longer makes), empty
    ``objective``/``counters`` left out; returns how many states were checked."""
    import dataclasses
    import io

    import torch

    store, index = LocalStore(root), RunIndex(LocalStore(root), run_id)
    io_ = stage_io.StepStore(store)
    states = [index.lookup(step, "state") for step in index.steps()]
    for ref in states:
        state = io_.get_state(ref)
        data = dataclasses.asdict(state)
        for name in ("objective", "counters"):
            if not data[name]:
                del data[name]
        buf = io.BytesIO()
        torch.save(data, buf)
        assert state.to_bytes() == buf.getvalue() == store.get_bytes(ref), ref
    return len(states)
