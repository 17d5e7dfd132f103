"""Anchored Trajectory Balance (Eqs. 7–9, App. A–B) in its O(T) cumulative-sum form.

Flow at state i of trajectory x with T actions (Definition B.1):

    ũ(s_i) = sg[clip_[0,β](u_{q,x} + c_i)] + b_i   for i < T,     ũ(s_T) = log R_β(x).

Loss L_x = (1/K_T) Σ_{0≤i<j≤T} δ_{i:j}², δ_{i:j} = ũ(s_i) + Σ_{t=i}^{j−1} Δℓ_t − ũ(s_j),
K_T = T(T+1)/2. With o_k = ũ(s_k) − Σ_{t<k} Δℓ_t, δ_{i:j} = o_i − o_j, and (A.23)

    K_T L_x = (T+1) Σ_k o_k² − (Σ_k o_k)² = (T+1) Σ_k (o_k − ō)²,

which is what is computed (the centred form avoids the cancellation of the raw one). The batch
loss is the mean of L_x over trajectories.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from evosteer_core.objectives.base import (
    Objective,
    ObjectiveOutput,
    TrajectoryBatch,
    masked_mean,
    register_objective,
)


def implemented_flows(
    batch: TrajectoryBatch,
    beta: float,
    *,
    with_correction: bool = True,
    u: Tensor | None = None,
) -> Tensor:
    """ũ [B, T+1] of Definition B.1; entries after the terminal state are 0.

    The measured part clip(u + c) is detached; b enters with its gradient except at the
    terminal, which log R_β(x) overrides. ``with_correction=False`` drops b (anchor-only level).
    ``u`` [B] replaces the measured ``batch.u`` and keeps its gradient (ablation
    ``no_measured_flows``: a learned per-record scalar; c stays detached).
    """
    root = batch.u.detach() if u is None else u
    measured = (root[:, None] + batch.c.detach()).clamp(0.0, beta)
    flows = measured + batch.b if with_correction else measured
    terminal = batch.log_reward.detach()[:, None].to(flows.dtype)
    flows = torch.where(batch.terminal_mask(), terminal, flows)
    return torch.where(batch.state_mask(), flows, torch.zeros_like(flows))


def _offsets(flows: Tensor, delta_logp: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """(o [B, T+1], state mask [B, T+1]): o_k = ũ(s_k) − Σ_{t<k} Δℓ_t, zero on padding."""
    n_t = delta_logp.shape[1]
    action_mask = torch.arange(n_t, device=lengths.device)[None, :] < lengths[:, None]
    dl = torch.where(action_mask, delta_logp, torch.zeros_like(delta_logp))
    cum = torch.cat([torch.zeros_like(dl[:, :1]), dl.cumsum(dim=1)], dim=1)
    state_mask = torch.arange(n_t + 1, device=lengths.device)[None, :] <= lengths[:, None]
    o = torch.where(state_mask, flows - cum, torch.zeros_like(flows))
    return o, state_mask


def trajectory_losses(flows: Tensor, delta_logp: Tensor, lengths: Tensor) -> Tensor:
    """L_x [B] by the O(T) identity (A.23) from flows [B, T+1], Δℓ [B, T], lengths [B]."""
    o, state_mask = _offsets(flows, delta_logp, lengths)
    n_states = (lengths + 1).to(o.dtype)
    mean = o.sum(dim=1) / n_states
    centred = torch.where(state_mask, o - mean[:, None], torch.zeros_like(o))
    k_t = lengths.to(o.dtype) * n_states / 2
    return n_states * centred.pow(2).sum(dim=1) / k_t


def action_coefficients(flows: Tensor, delta_logp: Tensor, lengths: Tensor) -> Tensor:
    """Γ_t = (2/K_T) Σ_{i≤t<j} δ_{i:j} (A.22) as [B, T], 0 on padded actions.

    Σ_{i≤t<j} (o_i − o_j) = (T − t) Σ_{i≤t} o_i − (t + 1) Σ_{t<j≤T} o_j, so it is O(T).
    """
    o, _ = _offsets(flows, delta_logp, lengths)
    n_t = delta_logp.shape[1]
    t = torch.arange(n_t, device=lengths.device, dtype=o.dtype)[None, :]
    big_t = lengths.to(o.dtype)[:, None]
    prefix = o.cumsum(dim=1)[:, :n_t]
    suffix = o.sum(dim=1, keepdim=True) - prefix
    k_t = big_t * (big_t + 1) / 2
    gamma = 2.0 / k_t * ((big_t - t) * prefix - (t + 1) * suffix)
    return torch.where(t < big_t, gamma, torch.zeros_like(gamma))


@register_objective
class AnchorTB(Objective):
    """AnchorTB: trains θ (through Δℓ) and ψ (through b); u and c are measured, no gradient.

    Metrics: ``loss``; ``anchor_only_loss`` (b = 0 and Δℓ = 0: the level the measured flows
    alone give); ``mean_abs_delta_logp`` over valid actions; ``mean_b`` over non-terminal
    states; ``mean_u``; ``mean_abs_c`` over non-terminal states.
    """

    name = "anchortb"

    def __init__(self, beta: float = 2.0) -> None:
        super().__init__()
        if not beta >= 0:
            raise ValueError(f"AnchorTB.beta: expected >= 0, got {beta}")
        self.beta = float(beta)
        self.record_flows: nn.Parameter | None = None

    def learn_record_flows(self, n_records: int) -> None:
        """Ablation ``no_measured_flows`` (docs/ablations.md): u_q becomes a free scalar per
        training record, a parameter of this objective (so it joins the optimizer with θ and
        travels in the train state), instead of log(1 + a_β p̂_q). Each starts at
        log(1 + a_β/2), the measured anchor of an empty pool (p̂ = 1/2)."""
        if n_records < 1:
            raise ValueError(f"learn_record_flows: expected >= 1 records, got {n_records}")
        start = math.log1p(math.expm1(self.beta) / 2)
        self.record_flows = nn.Parameter(torch.full((n_records,), start))
        self.requires = ("record_index",)

    @classmethod
    def from_config(cls, cfg: Any, *, hidden_size: int | None = None) -> AnchorTB:
        """β is ``train.beta``, the one β of a run (the anchors' R_β uses it too)."""
        return cls(beta=cfg.train.beta)

    def compute(self, batch: TrajectoryBatch) -> ObjectiveOutput:
        u = None
        if self.record_flows is not None:
            assert batch.record_index is not None  # in ``requires``, checked by forward
            u = self.record_flows[batch.record_index]
        flows = implemented_flows(batch, self.beta, u=u)
        loss = trajectory_losses(flows, batch.delta_logp, batch.lengths).mean()
        with torch.no_grad():
            anchor_flows = implemented_flows(batch, self.beta, with_correction=False, u=u)
            zero_dl = torch.zeros_like(batch.delta_logp)
            anchor_only = trajectory_losses(anchor_flows, zero_dl, batch.lengths).mean()
            nonterminal = batch.state_mask() & ~batch.terminal_mask()
            metrics = {
                "loss": float(loss.detach()),
                "anchor_only_loss": float(anchor_only),
                "mean_abs_delta_logp": float(
                    masked_mean(batch.delta_logp.detach().abs(), batch.action_mask)
                ),
                "mean_b": float(masked_mean(batch.b.detach(), nonterminal)),
                "mean_u": float((batch.u if u is None else u).detach().mean()),
                "mean_abs_c": float(masked_mean(batch.c.detach().abs(), nonterminal)),
            }
        return ObjectiveOutput(loss=loss, metrics=metrics)
