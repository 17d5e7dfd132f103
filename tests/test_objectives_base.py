"""Collating variable-length trajectories into a padded batch."""

from __future__ import annotations

import pytest
import torch
from objective_oracle import span_loss_loop

from evosteer_core.objectives import AnchorTB, ScoredTrajectory, collate, trajectory_losses


def trajectory(n: int, seed: int, **extra) -> ScoredTrajectory:
    gen = torch.Generator().manual_seed(seed)
    return ScoredTrajectory(
        delta_logp=torch.randn(n, generator=gen, dtype=torch.float64).requires_grad_(True),
        u=torch.tensor(0.8, dtype=torch.float64),
        c=0.1 * torch.randn(n + 1, generator=gen, dtype=torch.float64),
        b=torch.randn(n + 1, generator=gen, dtype=torch.float64).requires_grad_(True),
        log_reward=1.5,
        **extra,
    )


def test_collate_pads_and_keeps_gradients() -> None:
    trajectories = [trajectory(2, 0, group_id=4), trajectory(5, 1, group_id=4)]
    batch = collate(trajectories)
    assert batch.lengths.tolist() == [2, 5] and batch.delta_logp.shape == (2, 5)
    assert batch.action_mask.tolist()[0] == [True, True, False, False, False]
    assert batch.group_ids.tolist() == [4, 4] and batch.rewards is None
    assert batch.log_reward.dtype == torch.float64
    AnchorTB()(batch).loss.backward()
    assert trajectories[0].delta_logp.grad.shape == (2,)
    assert trajectories[1].b.grad[-1] == 0  # terminal entry overridden


def test_collated_loss_equals_each_trajectory_alone() -> None:
    trajectories = [trajectory(n, seed) for seed, n in enumerate([1, 4, 9])]
    batch = collate(trajectories)
    measured = (batch.u[:, None] + batch.c).clamp(0, 2.0) + batch.b
    losses = trajectory_losses(
        torch.where(batch.terminal_mask(), batch.log_reward[:, None], measured),
        batch.delta_logp,
        batch.lengths,
    )
    for row, traj in enumerate(trajectories):
        n = traj.delta_logp.shape[0]
        flows = torch.cat([(0.8 + traj.c[:n]).clamp(0, 2.0) + traj.b[:n], torch.tensor([1.5])])
        assert losses[row].item() == pytest.approx(span_loss_loop(flows, traj.delta_logp, n).item())


def test_collate_rejects_mismatched_shapes() -> None:
    bad = trajectory(3, 0)
    bad.c = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"trajectory 1: c must have shape \(4,\)"):
        collate([trajectory(2, 1), bad])
    with pytest.raises(ValueError, match="delta_logp must have shape"):
        collate([trajectory(0, 2)])
    with pytest.raises(ValueError, match="no trajectories"):
        collate([])
