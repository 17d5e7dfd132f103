"""The cells of an experiment: one run per (row, seed), its config, and its evaluation.

A cell's config is the experiment's base config with the row's overrides and ``train.seed`` set
to the seed, and no ``experiment`` section: it is an ordinary run (its own run id, cache keys
and MLflow run), so a cell that finished once is a cache hit when the experiment runs again.
Every cell of a seed is evaluated on the same held-out records under the same evaluation tags,
so two rows are compared on common random numbers (docs/experiments.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from evosteer_core.episode.world import load_records
from evosteer_core.evaluation.rows import row_rollouts
from evosteer_core.infra.artifacts import RunIndex, canonical_json
from evosteer_core.infra.config import (
    ExperimentConfig,
    ExperimentRow,
    RunConfig,
    config_from_dict,
)
from evosteer_core.infra.configio import ConfigError, to_plain
from evosteer_core.infra.runs import config_hash
from evosteer_core.pipeline.stage_io import StepStore, method_of
from evosteer_core.training.session import open_session
from evosteer_core.training.state import TrainState

CELL_COLUMNS = ("record_id", "family", "run", "reward", "tokens", "tokens_in", "tokens_out")
"""What a cell's evaluation keeps per trajectory (one per held-out record and run): the
reward and the tokens of the per-item cost table (``evaluation/costs.py``)."""

COLLABFLOW_EVALS = ("checkpoint", "untrained")
"""The evaluations of a CollabFlow cell: the trained director θ or the untrained ρ (fixed
teams and baselines are ``untrained`` rows that set ``collabflow.fixed_team``)."""


@dataclass(frozen=True)
class Cell:
    """One (row, seed) of an experiment and the run config it trains and evaluates."""

    row: ExperimentRow
    seed: int
    config: RunConfig

    @property
    def label(self) -> str:
        return f"{self.row.name} / seed {self.seed}"


def experiment_of(cfg: RunConfig, source: str = "<config>") -> ExperimentConfig:
    """The config's ``experiment`` section, or a ConfigError saying it is missing."""
    if cfg.experiment is None:
        raise ConfigError(
            source,
            "experiment",
            "missing: an experiment needs rows and seeds "
            "(see configs/table2-sim.yaml and docs/experiments.md)",
        )
    return cfg.experiment


def experiment_id(cfg: RunConfig) -> str:
    """The experiment's id: its name plus 12 hex digits of a hash of the base config's hash
    and the experiment section (so two experiments on one base config are two experiments,
    and a re-run of the same one continues it)."""
    section = canonical_json(to_plain(experiment_of(cfg)))
    digest = hashlib.sha256(config_hash(cfg).encode() + section).hexdigest()
    return f"{cfg.name}-experiment-{digest[:12]}"


def cell_config(cfg: RunConfig, row: ExperimentRow, seed: int) -> RunConfig:
    """The run config of cell (``row``, ``seed``); a bad override names the row and key."""
    data = cfg.to_dict()
    data.pop("experiment", None)
    index = next(i for i, r in enumerate(experiment_of(cfg).rows) if r.name == row.name)
    source = f"experiment.rows[{index}] ({row.name})"
    return config_from_dict(data, source, {**row.set, "train.seed": seed})


def experiment_cells(cfg: RunConfig, source: str = "<config>") -> list[Cell]:
    """Every cell, row by row (in the rows' order), seed by seed; every config is built here,
    so a bad row fails before anything runs."""
    exp = experiment_of(cfg, source)
    cells = [Cell(row, seed, cell_config(cfg, row, seed)) for row in exp.rows for seed in exp.seeds]
    for i, row in enumerate(exp.rows):
        method = next(c.config.method for c in cells if c.row is row)
        if method == "collabflow" and row.eval not in COLLABFLOW_EVALS:
            raise ConfigError(
                source,
                f"experiment.rows[{i}] ({row.name}).eval",
                f"a method: collabflow row is {' or '.join(COLLABFLOW_EVALS)}, got {row.eval!r} "
                "(a fixed team is an untrained row with collabflow.fixed_team)",
            )
    return cells


def longest_first(cells: Sequence[Cell]) -> list[Cell]:
    """The order ``evosteer experiment`` runs cells in: trained cells before evaluation-only
    ones (an hour against minutes at table2-sim's scale), so the last cells to finish on a
    few cores are short ones; otherwise the rows' order, seed by seed."""
    return sorted(cells, key=lambda c: not c.row.trained)


EVALUATION_TAG = "experiment"
"""The evaluation tag of every cell (run k is seeded by ``experiment/k``): the same in every
row, so the rows of a seed share their episode seeds."""


def cell_trajectories(
    cfg: RunConfig,
    state: TrainState,
    evaluation: str,
    runs: int,
    searched: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """The cell's row (``evaluation``: a row's ``eval``, ``evaluation.rows``) on every held-out
    record, ``runs`` times (frozen: no pairs, no updates), one trajectory per (record, run)
    with :data:`CELL_COLUMNS`; ``searched`` is the searched-workflow artifact of a
    ``paradigm:searched`` row."""
    session = open_session(cfg, state)
    heldout = load_records(cfg)[1]
    table = row_rollouts(session, evaluation, heldout, runs, EVALUATION_TAG, searched)
    return table[list(CELL_COLUMNS)]


def training_costs(io_: StepStore, cfg: RunConfig, run_id: str) -> dict[str, float]:
    """A trained cell's cost figures, averaged over its steps: the update's ms per trained
    episode and the rollout's tokens per problem (recorded when ``objectives.cost_metrics``
    is on; empty otherwise). The metrics are those of the artifact the method's ``update``
    stage writes (EvoSteer's ``update``, a CollabFlow round's ``round``)."""
    index = RunIndex(io_.store, run_id)
    (name,) = method_of(cfg).stage("update").writes
    steps = range(1, cfg.train.steps + 1)
    metrics = [io_.get_object(index.lookup(k, name))["metrics"] for k in steps]
    keys = {
        "update_ms_per_episode": "update_ms_per_episode",
        "tokens_per_problem": "train_tokens_per_problem",
    }
    return {
        ours: sum(float(m[theirs]) for m in metrics) / len(metrics)
        for theirs, ours in keys.items()
        if metrics and all(theirs in m for m in metrics)
    }
