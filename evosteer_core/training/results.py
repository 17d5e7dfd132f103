"""What the stages of a step hand on: one typed result per stage.

Tables travel as DataFrames (stored as parquet); the other results are stored as one object,
the dict of their fields in field order (``to_dict``), which ``from_dict`` inverts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Self

import pandas as pd
import torch

from evosteer_core.episode.budget import TokenUsage


class StageObject:
    """A stage result stored as one object: the dict of its fields, in field order."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return cls(**data)


@dataclass
class Rollouts:
    """Stage 1: the step's trajectory and decision tables, and the tokens its episodes used
    (not stored with the tables: the run's cost record, ``pipeline/usage.py``, keeps them)."""

    trajectories: pd.DataFrame
    decisions: pd.DataFrame
    usage: TokenUsage = field(default_factory=TokenUsage)


@dataclass
class Rescored:
    """Stage 2: ℓ_θ, ℓ_ρ and h_ρ of every recorded decision (one row per decision)."""

    table: pd.DataFrame


@dataclass
class ValueFit(StageObject):
    """Stage 3: the fitted value and outcome heads, the new replay window, fit metrics."""

    value_head: dict[str, torch.Tensor]
    outcome_heads: dict[str, torch.Tensor]
    window: list[dict[str, list]]
    metrics: dict[str, float]


@dataclass
class ActorUpdate(StageObject):
    """Stage 4: the updated adapter, b_ψ, optimizer state and anchor statistics, the run's
    count of skipped (non-finite) updates, metrics, and the objective's own learned state."""

    adapter: dict[str, torch.Tensor]
    flow_head: dict[str, torch.Tensor]
    actor_optimizer: dict[str, Any]
    pool: dict[str, Any]
    buckets: dict[str, Any]
    nonfinite_steps: int
    metrics: dict[str, float]
    objective: dict[str, torch.Tensor] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields; ``objective`` only when the objective has learned state, so the updates
        of objectives without any (AnchorTB) keep their bytes."""
        data = super().to_dict()
        if not data["objective"]:
            del data["objective"]
        return data


@dataclass
class Validation(StageObject):
    """Stage 5: the skill state after the validation round, and its metrics."""

    skills: dict[str, Any]
    metrics: dict[str, float]
