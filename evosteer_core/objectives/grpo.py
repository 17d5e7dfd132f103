"""GRPO (Shao et al., 2024) inside the architecture: group-relative advantages, no critic.

A group is the θ rollouts of one record in the step (``train.rollouts_theta`` of them, so that
is the group size). Trajectory i of group g gets, on every one of its actions,

    A_i = (r_i − mean_g r) / std_g r        std with Bessel's correction (n − 1);
    A_i = 0 when the group's rewards are all equal or it has one member (no baseline),

and the loss is mean_i (1/T_i) Σ_t [ −min(r_t A_i, clip(r_t) A_i) + β_KL · KL_t ], with r_t the
action ratio to the rollout policy and KL_t the KL-to-ρ term whose value is k3 and whose
gradient is that of KL(π_θ ‖ ρ) (:func:`~evosteer_core.objectives.policy_gradient.kl_to_reference`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from evosteer_core.objectives.base import (
    Objective,
    ObjectiveOutput,
    TrajectoryBatch,
    masked_mean,
    register_objective,
)
from evosteer_core.objectives.policy_gradient import (
    clipped_fraction,
    clipped_surrogate,
    k3,
    kl_to_reference,
)


def group_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """A [B]: (r − group mean) / group std (Bessel); 0 for all-equal or one-member groups."""
    out = torch.zeros_like(rewards)
    for g in torch.unique(group_ids):
        members = group_ids == g
        r = rewards[members]
        if r.numel() < 2 or bool((r == r[0]).all()):
            continue
        out[members] = (r - r.mean()) / r.std(correction=1)
    return out


@register_objective
class GRPO(Objective):
    """Group-relative policy optimization with the clipped ratio and a KL penalty to ρ.

    Metrics: ``loss``, ``policy_loss``, ``kl`` (mean k3 over actions), ``clip_fraction``,
    ``mean_ratio``, ``zero_advantage_groups`` (share of groups with no signal).
    """

    name = "grpo"
    requires = ("logp", "old_logp", "rewards", "group_ids")
    arms = ("theta",)

    def __init__(self, *, clip: float = 0.2, kl_coef: float = 0.04) -> None:
        super().__init__()
        self.clip, self.kl_coef = float(clip), float(kl_coef)

    @classmethod
    def from_config(cls, cfg: Any, *, hidden_size: int | None = None) -> GRPO:
        g = cfg.objectives.grpo
        return cls(clip=g.clip, kl_coef=g.kl_coef)

    def compute(self, batch: TrajectoryBatch) -> ObjectiveOutput:
        mask = batch.action_mask
        maskf = mask.to(batch.delta_logp.dtype)
        zero = torch.zeros_like(batch.delta_logp)
        logp = torch.where(mask, batch.logp, zero)
        old = torch.where(mask, batch.old_logp, zero)
        delta = torch.where(mask, batch.delta_logp, zero)
        adv = group_advantages(batch.rewards.detach(), batch.group_ids)
        surrogate = clipped_surrogate(logp, old, adv[:, None].expand_as(logp), self.clip)
        ratio = torch.exp(logp.detach() - old.detach())
        kl = kl_to_reference(delta, ratio)
        per_action = surrogate + self.kl_coef * kl
        per_traj = (per_action * maskf).sum(dim=1) / batch.lengths.to(maskf.dtype)
        loss = per_traj.mean()
        with torch.no_grad():
            groups = torch.unique(batch.group_ids)
            silent = sum(bool((adv[batch.group_ids == g] == 0).all()) for g in groups)
            metrics = {
                "loss": float(loss),
                "policy_loss": float(((surrogate * maskf).sum(1) / maskf.sum(1)).mean()),
                "kl": float(masked_mean(k3(delta), mask)),
                "clip_fraction": float(masked_mean(clipped_fraction(logp, old, self.clip), mask)),
                "mean_ratio": float(masked_mean(ratio, mask)),
                "zero_advantage_groups": silent / len(groups),
            }
        return ObjectiveOutput(loss=loss, metrics=metrics)
