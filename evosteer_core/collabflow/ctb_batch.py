"""The CTB training batch from a round's valid constructions (docs/collabflow.md §3).

A training step hands :func:`ctb_batch` one :class:`CTBTrajectory` per valid construction
(aborted ones never enter): per decision the legal-set log-probabilities under θ (with their
graph, so the loss reaches θ through them) and under the director that collected the batch,
and the chosen index; the canonical team, its task cluster and its team reward R̃. The
result is a :class:`~evosteer_core.objectives.TrajectoryBatch` for ``objectives.ctb``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from evosteer_core.collabflow.backward import N_FEATURES, unbuilding, uniform_log_prob
from evosteer_core.collabflow.reward import cluster_index
from evosteer_core.collabflow.team import STOP, BuildAction, Team
from evosteer_core.objectives.base import TrajectoryBatch

if TYPE_CHECKING:
    from evosteer_core.collabflow.construction import Construction


@dataclass
class ScoredDecision:
    """One decision: log π̄ over its legal set (in ``legal_actions`` order) under θ and under
    the collecting director, and the index of the action taken."""

    legal_logp: Tensor
    ref_legal_logp: Tensor
    chosen: int

    @classmethod
    def from_scores(cls, scores: Tensor, ref_scores: Tensor, chosen: int) -> ScoredDecision:
        """From the summed token log-probs of every legal action string (the director's
        scores under θ and under the collecting director): renormalized over the legal set.
        Pass ``scores`` as a leaf to take the θ-gradient afterwards from ``scores.grad``."""
        return cls(torch.log_softmax(scores, 0), torch.log_softmax(ref_scores.detach(), 0), chosen)


@dataclass
class CTBTrajectory:
    """A valid construction: its decisions and actions (the last one ``stop``), the team it
    built, the task cluster and the team reward R̃ (> 0) of its execution."""

    steps: Sequence[ScoredDecision]
    actions: Sequence[BuildAction]
    team: Team
    cluster: str
    reward: float


def ctb_trajectory(
    construction: Construction, theta_legal_logp: Sequence[Tensor], cluster: str, reward: float
) -> CTBTrajectory:
    """A valid construction episode as CTB sees it: ``theta_legal_logp[t]`` is log π̄_θ over
    step t's legal strings (``director.legal_logprobs`` with ``requires_grad``; a one-action
    step may pass ``zeros(1)``), the reference is the step's recorded ``legal_logp``."""
    if construction.aborted:
        raise ValueError(f"an aborted construction never enters CTB ({construction.abort_reason})")
    if len(theta_legal_logp) != len(construction.steps):
        raise ValueError(
            f"{len(theta_legal_logp)} rescored decisions for {len(construction.steps)} steps"
        )
    decisions = [
        ScoredDecision(
            logp, torch.tensor(step.legal_logp, dtype=logp.dtype, device=logp.device), step.index
        )
        for logp, step in zip(theta_legal_logp, construction.steps, strict=True)
    ]
    assert construction.team is not None
    return CTBTrajectory(decisions, construction.actions, construction.team, cluster, reward)


def _check(row: int, traj: CTBTrajectory) -> None:
    if not traj.steps or len(traj.steps) != len(traj.actions):
        raise ValueError(
            f"trajectory {row}: {len(traj.steps)} decisions for {len(traj.actions)} actions"
        )
    if traj.actions[-1] != STOP:
        raise ValueError(f"trajectory {row}: a valid construction ends with stop")
    if not traj.reward > 0:
        raise ValueError(f"trajectory {row}: the team reward must be > 0, got {traj.reward}")
    for t, step in enumerate(traj.steps):
        n = step.legal_logp.shape[0]
        if step.legal_logp.dim() != 1 or step.ref_legal_logp.shape != step.legal_logp.shape:
            raise ValueError(f"trajectory {row} decision {t}: legal log-probs must be [A] each")
        if not 0 <= step.chosen < n:
            raise ValueError(f"trajectory {row} decision {t}: chosen {step.chosen} not in 0..{n - 1}")


def _pad(values: Sequence[Tensor], shape: tuple[int, ...], fill: float = 0.0) -> Tensor:
    """Stack tensors, each zero-padded at the end of every dimension to ``shape``."""
    out = []
    for v in values:
        pads: list[int] = []
        for dim in reversed(range(v.dim())):
            pads += [0, shape[dim] - v.shape[dim]]
        out.append(nn.functional.pad(v, pads, value=fill))
    return torch.stack(out)


def ctb_batch(trajectories: Sequence[CTBTrajectory], backward: str) -> TrajectoryBatch:
    """The padded CTB batch; ``backward`` is ``learned`` (the unbuilding features of b_φ) or
    ``uniform`` (log b = −log |O(G)| per trajectory). EvoSteer's required fields that CTB
    does not read are zero (u, c, b); ``delta_logp`` is log π̄_θ − log π̄_ref of each action."""
    if not trajectories:
        raise ValueError("ctb_batch: no valid constructions")
    for row, traj in enumerate(trajectories):
        _check(row, traj)
    dtype = trajectories[0].steps[0].legal_logp.dtype
    lengths = torch.tensor([len(t.steps) for t in trajectories])
    n_b, n_t = len(trajectories), int(lengths.max())
    n_a = max(s.legal_logp.shape[0] for t in trajectories for s in t.steps)

    def per_state(field: str, fill: float = 0.0) -> Tensor:
        rows = [_pad([getattr(s, field) for s in t.steps], (n_a,), fill) for t in trajectories]
        return _pad(rows, (n_t, n_a), fill)

    legal_logp, ref_legal_logp = per_state("legal_logp"), per_state("ref_legal_logp")
    sizes = [torch.tensor([s.legal_logp.shape[0] for s in t.steps]) for t in trajectories]
    legal_mask = torch.arange(n_a)[None, None, :] < _pad(sizes, (n_t,))[:, :, None]
    chosen = _pad([torch.tensor([s.chosen for s in t.steps]) for t in trajectories], (n_t,))
    logp = legal_logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    ref_logp = ref_legal_logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).detach()
    action_mask = torch.arange(n_t)[None, :] < lengths[:, None]
    zero = torch.zeros(n_b, n_t, dtype=dtype)
    batch = TrajectoryBatch(
        delta_logp=torch.where(action_mask, logp - ref_logp, zero),
        action_mask=action_mask,
        lengths=lengths,
        u=torch.zeros(n_b, dtype=dtype),
        c=torch.zeros(n_b, n_t + 1, dtype=dtype),
        b=torch.zeros(n_b, n_t + 1, dtype=dtype),
        log_reward=torch.tensor([t.reward for t in trajectories], dtype=dtype).log(),
        logp=torch.where(action_mask, logp, zero),
        ref_logp=torch.where(action_mask, ref_logp, zero),
        legal_logp=legal_logp,
        ref_legal_logp=ref_legal_logp,
        legal_mask=legal_mask,
        context_index=torch.tensor([cluster_index(t.cluster) for t in trajectories]),
    )
    if backward == "uniform":
        batch.log_backward = torch.tensor(
            [uniform_log_prob(t.team) for t in trajectories], dtype=dtype
        )
    else:
        _add_unbuilding(batch, trajectories, dtype)
    batch.validate()
    return batch


def _add_unbuilding(
    batch: TrajectoryBatch, trajectories: Sequence[CTBTrajectory], dtype: torch.dtype
) -> None:
    """b_φ's inputs: each team unbuilt along the reverse of its construction order."""
    unbuilt = [unbuilding(t.team, list(t.actions[:-1])) for t in trajectories]
    n_s = max(len(choices) for _, choices in unbuilt)
    n_k = max(len(step) for features, _ in unbuilt for step in features)
    feats, masks, choices = [], [], []
    for features, choice in unbuilt:
        steps = [torch.tensor(step, dtype=dtype) for step in features]
        feats.append(_pad(steps, (n_k, N_FEATURES)))
        masks.append(_pad([torch.ones(len(step), dtype=torch.long) for step in features], (n_k,)))
        choices.append(torch.tensor(choice, dtype=torch.long))
    batch.backward_features = _pad(feats, (n_s, n_k, N_FEATURES))
    batch.backward_mask = _pad(masks, (n_s, n_k)).bool()
    batch.backward_choice = _pad(choices, (n_s,))
