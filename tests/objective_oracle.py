"""The AnchorTB loss by its definition, summing every subtrajectory residual (test oracle).

Two independent forms of Σ_{0≤i<j≤T} δ_{i:j}² / K_T, neither using the cumulative-sum identity:

* :func:`span_loss_loop` walks every span (i, j) in Python and sums Δℓ_i..Δℓ_{j−1} itself —
  the literal formula, O(T²) Python steps (plus O(T) each for the inner sum).
* :func:`span_loss_matrix` builds the span–action incidence A_T[(i,j), t] = 1{i ≤ t < j}
  (Prop. A.13) and evaluates all residuals as ũ_i − ũ_j + A_T Δℓ at once: O(T²) memory and
  O(T³) work per trajectory, vectorised over spans.

Both take the flows ũ from :func:`evosteer_core.objectives.anchortb.implemented_flows`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def span_loss_loop(flows: Tensor, delta_logp: Tensor, length: int) -> Tensor:
    """L_x of one trajectory: flows [≥ T+1], Δℓ [≥ T], T = ``length`` ≥ 1; plain double loop."""
    if length < 1:
        raise ValueError(f"span_loss_loop: a trajectory needs >= 1 action, got {length}")
    total = flows.new_zeros(())
    for i in range(length):
        for j in range(i + 1, length + 1):
            residual = flows[i] - flows[j]
            for t in range(i, j):
                residual = residual + delta_logp[t]
            total = total + residual * residual
    return total / (length * (length + 1) / 2)


def span_incidence(
    length: int, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor, Tensor]:
    """(starts, ends, A_T): the K_T spans i < j and the incidence A_T [K_T, T] = 1{i ≤ t < j}."""
    starts, ends = torch.triu_indices(length + 1, length + 1, offset=1)
    t = torch.arange(length)
    incidence = ((starts[:, None] <= t[None, :]) & (t[None, :] < ends[:, None])).to(dtype)
    return starts, ends, incidence


def span_loss_matrix(flows: Tensor, delta_logp: Tensor, lengths: Tensor) -> Tensor:
    """L_x [B] by the explicit span sum, vectorised over spans and over rows of equal length."""
    losses = flows.new_zeros(flows.shape[0])
    for length in sorted(set(lengths.tolist())):
        rows = (lengths == length).nonzero().squeeze(1)
        starts, ends, incidence = span_incidence(length, flows.dtype)
        sub = flows[rows]
        residuals = sub[:, starts] - sub[:, ends] + delta_logp[rows, :length] @ incidence.T
        losses = losses.index_put((rows,), residuals.pow(2).sum(dim=1) / incidence.shape[0])
    return losses


def span_coefficients_loop(flows: Tensor, delta_logp: Tensor, length: int) -> Tensor:
    """Γ_t = (2/K_T) Σ_{i≤t<j} δ_{i:j} (A.22) for one trajectory, by looping over spans."""
    k_t = length * (length + 1) / 2
    gamma = []
    for t in range(length):
        acc = flows.new_zeros(())
        for i in range(t + 1):
            for j in range(t + 1, length + 1):
                acc = acc + flows[i] - flows[j] + delta_logp[i:j].sum()
        gamma.append(2.0 * acc / k_t)
    return torch.stack(gamma)
