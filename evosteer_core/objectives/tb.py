"""Trajectory Balance with a learned scalar log Z, on AnchorTB's reference-tilted target.

The target is P*(x) ∝ ρ(x) R_β(x) (Eq. 2). A history has exactly one parent per state, so the
backward policy is 1 and the executor's transition factors cancel between P_θ and ρ; the TB
residual of a trajectory is therefore

    δ_x = log Z + Σ_t Δℓ_t − log R_β(x),     loss = mean_x δ_x²,

i.e. AnchorTB's single full-path span (0, T) with a free learned root instead of measured flows.
It is the "TB (learned log Z)" row of the objective comparison (docs/method.md §1.10).
"""

from __future__ import annotations

import torch
from torch import nn

from evosteer_core.objectives.base import (
    Objective,
    ObjectiveOutput,
    TrajectoryBatch,
    register_objective,
)


@register_objective
class TrajectoryBalance(Objective):
    """TB with a learned log Z (a module parameter; give it to the optimizer with θ)."""

    name = "tb"

    def __init__(self, init_log_z: float = 0.0) -> None:
        super().__init__()
        self.log_z = nn.Parameter(torch.tensor(float(init_log_z)))

    def compute(self, batch: TrajectoryBatch) -> ObjectiveOutput:
        delta = torch.where(batch.action_mask, batch.delta_logp, torch.zeros_like(batch.delta_logp))
        residual = self.log_z + delta.sum(dim=1) - batch.log_reward.detach()
        loss = residual.pow(2).mean()
        metrics = {
            "loss": float(loss.detach()),
            "log_z": float(self.log_z.detach()),
            "mean_abs_residual": float(residual.detach().abs().mean()),
        }
        return ObjectiveOutput(loss=loss, metrics=metrics)
