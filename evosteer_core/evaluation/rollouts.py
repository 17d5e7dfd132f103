"""Evaluation rollouts: π_θ (or ρ) on given records, with no pairs and no updates, and the
per-run scores of a checkpoint on one benchmark (what the evaluate workflow fans out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from evosteer_core.benchmarks.loaders import load_benchmark
from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.rollout import EpisodePlan, collect_rollouts
from evosteer_core.episode.world import load_records, stage_records
from evosteer_core.evaluation.rows import CHECKPOINT, row_rollouts, run_means
from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.training.session import Session, open_session
from evosteer_core.training.state import TrainState


def evaluation_rollouts(
    s: Session,
    records: list[TaskRecord],
    use_adapter: bool,
    runs: int = 1,
    tag: str = "eval",
    menus: dict | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Trajectories and decisions of π_θ (or ρ) on ``records``, with the session's menus or the
    given ``menus``, scored by the official reward; θ and ρ runs of the same tag share every
    seed."""
    arm = "theta" if use_adapter else "rho"
    plans = [EpisodePlan(r, arm, k, evaluation=True) for r in records for k in range(runs)]
    ctx = s.rollout_context(derive_seed(s.cfg.train.seed, tag), 0, menus, evaluation=True)
    return collect_rollouts(s.policy, plans, ctx)


def evaluate_policy(
    s: Session,
    records: list[TaskRecord],
    use_adapter: bool,
    runs: int = 1,
    tag: str = "eval",
    menus: dict | None = None,
) -> float:
    """Mean reward of :func:`evaluation_rollouts`."""
    trajectories, _ = evaluation_rollouts(s, records, use_adapter, runs, tag, menus)
    return float(trajectories["reward"].mean())


def benchmark_records(cfg: RunConfig, benchmark: str, path: str) -> list[TaskRecord]:
    """A real benchmark file (``path``, read and validated) or, with no path, the held-out
    records of the family ``benchmark`` (the sim suite's, or the config's held-out slices) or,
    for a benchmark that is no family, the config's held-out slices of that benchmark (e.g.
    ``humaneval`` from a ``data.heldout`` slice of it)."""
    if path:
        return load_benchmark(benchmark, path)
    heldout = load_records(cfg)[1]
    if benchmark in FAMILIES:
        return [r for r in heldout if r.family == benchmark]
    own = [r for r in heldout if r.source == benchmark]
    if not own:
        raise ValueError(
            f"benchmark {benchmark!r} needs a file path or a data.heldout slice of it; "
            f"sim families: {FAMILIES}"
        )
    return own


def stage_benchmark_records(
    cfg: RunConfig, store: ArtifactStore, benchmark: str, path: str
) -> ArtifactRef:
    """:func:`benchmark_records`, loaded once where the evaluation is launched and stored as a
    validated task table: the evaluation tasks read (and are cached on) this artifact, never
    the path."""
    return stage_records(store, benchmark_records(cfg, benchmark, path), benchmark)


def benchmark_scores(
    cfg: RunConfig, state: TrainState, benchmark: str, records: list[TaskRecord], runs: int
) -> list[float]:
    """Mean reward of the frozen π_θ of ``state`` on one benchmark's ``records``, once per run
    (each run with its own seeds, tagged ``eval/<benchmark>/<k>``): the ``checkpoint`` row of
    :func:`evaluate_row`."""
    return run_means(evaluate_row(cfg, state, benchmark, records, runs, CHECKPOINT))


def evaluate_row(
    cfg: RunConfig,
    state: TrainState,
    benchmark: str,
    records: list[TaskRecord],
    runs: int,
    row: str,
    searched: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """The row table of one evaluation row on one benchmark (tag ``eval/<benchmark>``, so all
    rows of a benchmark are paired; ``evaluation.rows``)."""
    return row_rollouts(open_session(cfg, state), row, records, runs, f"eval/{benchmark}", searched)
