"""Collaborative Trajectory Balance (CollabFlow's objective, docs/collabflow.md §3).

A construction trajectory ζ of T decisions (its last one the stop) ends at the canonical
terminal of its team G; its residual and the loss over a batch are

    ρ(ζ) = log Z_ψ(c) + Σ_t log p_F(e_t) − β · log R̃(ζ) − Σ_t log b(e_t),
    L = mean_ζ (ρ(ζ)/T)² + α_KL · mean_v KL(π̄_θ(·|v) ‖ π̄_{θ_k}(·|v)),

with p_F the director's legal-set policy π̄_θ, R̃ the team reward (``collabflow.reward``),
b the backward kernel at the terminal (``collabflow.backward``: learned b_φ or uniform
1/|O(G)|) and log Z_ψ(c) one learned scalar per task cluster. The KL runs over the legal set
of every decision state of the batch (uniform state weighting) against the director that
collected the batch; only valid trajectories enter (aborted constructions never do).

With one parent per state (EvoSteer's interleaved histories) b ≡ 1, so ρ is TB's residual
on the reward R̃^β: CTB is then TB with the team reward, the 1/T scaling and the KL term.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from evosteer_core.collabflow.backward import BackwardPolicy
from evosteer_core.collabflow.reward import CLUSTERS
from evosteer_core.objectives.base import (
    Objective,
    ObjectiveOutput,
    TrajectoryBatch,
    masked_mean,
    register_objective,
)

BACKWARDS: tuple[str, ...] = ("learned", "uniform")
_LEARNED = ("backward_features", "backward_mask", "backward_choice")
_KL = ("legal_logp", "ref_legal_logp", "legal_mask")


@register_objective
class CollaborativeTB(Objective):
    """CTB with learned log Z_ψ (one per context) and b_φ (``backward: learned``).

    Metrics: ``loss``, ``balance`` (mean (ρ/T)²), ``kl``, ``mean_abs_residual``, ``log_z``
    (mean over contexts), ``mean_log_pb`` (per trajectory).
    """

    name = "ctb"

    def __init__(
        self,
        *,
        beta: float = 1.0,
        alpha_kl: float = 0.1,
        backward: str = "learned",
        n_contexts: int = len(CLUSTERS),
    ) -> None:
        super().__init__()
        if not beta > 0 or not alpha_kl >= 0 or n_contexts < 1:
            raise ValueError(
                f"ctb: need beta > 0, alpha_kl >= 0, n_contexts >= 1, got {beta}, {alpha_kl}, "
                f"{n_contexts}"
            )
        if backward not in BACKWARDS:
            raise ValueError(f"ctb: backward must be one of {BACKWARDS}, got {backward!r}")
        self.beta, self.alpha_kl, self.backward = float(beta), float(alpha_kl), backward
        self.log_z = nn.Parameter(torch.zeros(n_contexts))
        self.backward_policy = BackwardPolicy() if backward == "learned" else None
        needs = ("logp", "context_index")
        needs += _LEARNED if backward == "learned" else ("log_backward",)
        self.requires = needs + (_KL if alpha_kl > 0 else ())

    @classmethod
    def from_config(cls, cfg: Any, *, hidden_size: int | None = None) -> CollaborativeTB:
        """β, α_KL and the backward kernel from the run's ``collabflow`` section."""
        c = getattr(cfg, "collabflow", None)
        if c is None:
            raise ValueError("train.objective: ctb needs method: collabflow (its collabflow section)")
        return cls(beta=c.beta, alpha_kl=c.alpha_kl, backward=c.backward)

    def log_backward(self, batch: TrajectoryBatch) -> Tensor:
        """Σ_t log b(e_t) per trajectory [B]."""
        if self.backward_policy is None:
            return batch.log_backward
        return self.backward_policy(
            batch.backward_features, batch.backward_mask, batch.backward_choice
        )

    def residuals(self, batch: TrajectoryBatch) -> Tensor:
        """ρ(ζ) [B] (unscaled)."""
        forward = torch.where(batch.action_mask, batch.logp, torch.zeros_like(batch.logp)).sum(1)
        target = self.beta * batch.log_reward.detach()
        return self.log_z[batch.context_index] + forward - target - self.log_backward(batch)

    def kl(self, batch: TrajectoryBatch) -> Tensor:
        """mean over the batch's decision states of KL(π̄_θ ‖ π̄_ref) on the legal set."""
        mask = batch.legal_mask
        zero = torch.zeros_like(batch.legal_logp)
        logp = torch.where(mask, batch.legal_logp, zero)
        ref = torch.where(mask, batch.ref_legal_logp.detach(), zero)
        per_state = torch.where(mask, logp.exp() * (logp - ref), zero).sum(-1)
        return masked_mean(per_state, batch.action_mask)

    def compute(self, batch: TrajectoryBatch) -> ObjectiveOutput:
        residual = self.residuals(batch)
        scaled = residual / batch.lengths.to(residual.dtype)
        balance = scaled.pow(2).mean()
        kl = self.kl(batch) if self.alpha_kl > 0 else torch.zeros((), dtype=residual.dtype)
        loss = balance + self.alpha_kl * kl
        with torch.no_grad():
            metrics = {
                "loss": float(loss),
                "balance": float(balance),
                "kl": float(kl),
                "mean_abs_residual": float(residual.abs().mean()),
                "log_z": float(self.log_z.mean()),
                "mean_log_pb": float(self.log_backward(batch).mean()),
            }
        return ObjectiveOutput(loss=loss, metrics=metrics)
