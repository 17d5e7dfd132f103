"""Pieces PPO and GRPO share: the clipped surrogate and the KL-to-ρ term with the k3 value.

Units are actions: the ratio of action t is r_t = exp(ℓ_θ(a_t|s_t) − ℓ_old(a_t|s_t)), with ℓ the
summed token log-probability of the whole action under the grammar mask (docs/objectives.md §8).
"""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """Per-unit loss −min(r·A, clip_[1−ε, 1+ε](r)·A), r = exp(ℓ_θ − ℓ_old); same shape as logp.

    A unit whose ratio left the interval on the side its advantage pushes towards gets exactly
    zero gradient (the clipped branch is a constant); the other units get A·r·∇ℓ_θ."""
    ratio = torch.exp(logp - old_logp.detach())
    advantages = advantages.detach()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages
    return -torch.minimum(unclipped, clipped)


def clipped_fraction(logp: Tensor, old_logp: Tensor, clip: float) -> Tensor:
    """[same shape] bool: the unit's ratio lies outside [1 − ε, 1 + ε]."""
    ratio = torch.exp(logp.detach() - old_logp.detach())
    return (ratio < 1.0 - clip) | (ratio > 1.0 + clip)


def k3(delta_logp: Tensor) -> Tensor:
    """k3 = e^{−Δℓ} + Δℓ − 1 with Δℓ = ℓ_θ − ℓ_ρ at an action sampled from π_θ: an unbiased,
    non-negative estimate of KL(π_θ ‖ ρ) at that state."""
    return torch.expm1(-delta_logp) + delta_logp


def kl_to_reference(delta_logp: Tensor, weight: Tensor | None = None) -> Tensor:
    """The KL term per unit: value k3, gradient Δℓ·∇ℓ_θ (times the stopped ``weight``).

    The gradient of k3 itself with the sample held fixed is (1 − e^{−Δℓ})∇ℓ_θ, whose mean under
    π_θ is −Σ_a ρ(a)∇log π_θ(a) = ∇KL(ρ ‖ π_θ), the *reverse* KL. The mean of Δℓ·∇ℓ_θ under π_θ
    is Σ_a π_θ(a)(log π_θ(a) − log ρ(a))∇log π_θ(a) = ∇KL(π_θ ‖ ρ), the KL the objective names
    (docs/objectives.md §9); so the term is sg(k3) + ½Δℓ² − sg(½Δℓ²). ``weight`` (the stopped
    ratio π_θ/π_old) makes both unbiased when the action came from π_old ≠ π_θ."""
    half_sq = 0.5 * delta_logp.pow(2)
    term = k3(delta_logp).detach() + half_sq - half_sq.detach()
    return term if weight is None else weight.detach() * term
