"""Tempered trajectory balance (the Fig. 6a "Tempered TB" row) over the DAG of edit sets.

Residual of a trajectory x with actions a_0 … a_{T−1} (docs/objectives.md §10):

    δ_x = log Z + Σ_t ℓ_θ(a_t|s_t) / n_t − β_T · log(r(x) + ε) − Σ_t log P_B(s_t | s_{t+1}),
    loss = mean_x δ_x²,

with log Z learned, n_t the number of *sampled* tokens of action t (positions where the grammar
left more than one token; at least 1), and a learned backward policy P_B. The target is on the
raw reward r(x) ∈ [0, 1], not on ρ: it is TB's own target, tempered.

**The DAG.** Histories form a tree (one parent each), where a backward policy is 1 and has
nothing to learn. The tempered TB of the paper runs on a DAG, so this one forgets order: the
state after t actions is the multiset {a_0, …, a_{t−1}}, reached by every order of the same
edits. Its parents are the states with one of its edits removed, so

    P_B(s_t | s_{t+1}) = softmax_{j ≤ t}(w[k_j])[t]     for t < T − 1,
    P_B = 1 for the last action (the episode-ending action is the terminal state's one parent),

with w one learned logit per action kind k (the seven kinds of docs/method.md §1.2), zero at
init (P_B uniform over the parents).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from evosteer_core.objectives.base import (
    Objective,
    ObjectiveOutput,
    TrajectoryBatch,
    register_objective,
)

N_ACTION_KINDS = 7
"""ADD_AGENT, ADD_EDGE, BIND_SKILL, SET_OUTPUT, RERUN_AGENT, DROP_AGENT, STOP."""


def backward_log_probs(kind_logits: Tensor, kinds: Tensor, lengths: Tensor) -> Tensor:
    """log P_B [B, T] of each action under the edit-set DAG (0 on the last and on padding)."""
    n_t = kinds.shape[1]
    t = torch.arange(n_t, device=lengths.device)[None, :]
    w = kind_logits[kinds.clamp(0, kind_logits.shape[0] - 1)]
    log_pb = w - torch.logcumsumexp(w, dim=1)
    keep = t < (lengths[:, None] - 1)
    return torch.where(keep, log_pb, torch.zeros_like(log_pb))


@register_objective
class TemperedTB(Objective):
    """TB with a tempered log reward, learned log Z and backward policy, per-token log-probs.

    Metrics: ``loss``, ``log_z``, ``mean_abs_residual``, ``mean_log_pb`` (per trajectory).
    """

    name = "tempered_tb"
    requires = ("logp", "rewards", "token_counts", "action_kinds")

    def __init__(
        self, *, beta: float = 2.0, epsilon: float = 0.01, init_log_z: float = 0.0
    ) -> None:
        super().__init__()
        if not beta > 0 or not epsilon > 0:
            raise ValueError(f"tempered_tb: beta and epsilon must be > 0, got {beta}, {epsilon}")
        self.beta, self.epsilon = float(beta), float(epsilon)
        self.log_z = nn.Parameter(torch.tensor(float(init_log_z)))
        self.kind_logits = nn.Parameter(torch.zeros(N_ACTION_KINDS))

    @classmethod
    def from_config(cls, cfg: Any, *, hidden_size: int | None = None) -> TemperedTB:
        c = cfg.objectives.tempered_tb
        return cls(beta=c.beta, epsilon=c.epsilon)

    def residuals(self, batch: TrajectoryBatch) -> Tensor:
        """δ_x [B] (the loss is their mean square)."""
        mask = batch.action_mask
        zero = torch.zeros_like(batch.delta_logp)
        counts = torch.where(mask, batch.token_counts.to(zero.dtype).clamp_min(1.0), 1.0 + zero)
        forward = torch.where(mask, batch.logp / counts, zero).sum(dim=1)
        log_pb = backward_log_probs(self.kind_logits, batch.action_kinds, batch.lengths).sum(1)
        target = self.beta * torch.log(batch.rewards.detach() + self.epsilon)
        return self.log_z + forward - target - log_pb

    def compute(self, batch: TrajectoryBatch) -> ObjectiveOutput:
        residual = self.residuals(batch)
        loss = residual.pow(2).mean()
        with torch.no_grad():
            log_pb = backward_log_probs(self.kind_logits, batch.action_kinds, batch.lengths)
            metrics = {
                "loss": float(loss),
                "log_z": float(self.log_z),
                "mean_abs_residual": float(residual.abs().mean()),
                "mean_log_pb": float(log_pb.sum(1).mean()),
            }
        return ObjectiveOutput(loss=loss, metrics=metrics)
