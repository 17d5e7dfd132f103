"""TB with learned log Z: the residual by hand, its log Z optimum, and registry access."""

from __future__ import annotations

import pytest
import torch
from objective_oracle import span_loss_loop

from evosteer_core.objectives import (
    ScoredTrajectory,
    TrajectoryBalance,
    build_objective,
    collate,
)


def scored(lengths: list[int], seed: int) -> list[ScoredTrajectory]:
    gen = torch.Generator().manual_seed(seed)
    return [
        ScoredTrajectory(
            delta_logp=torch.randn(n, generator=gen, dtype=torch.float64).requires_grad_(True),
            u=1.0,
            c=torch.zeros(n + 1, dtype=torch.float64),
            b=torch.zeros(n + 1, dtype=torch.float64),
            log_reward=2.0 * torch.rand((), generator=gen, dtype=torch.float64),
        )
        for n in lengths
    ]


def test_tb_residual_by_hand_and_log_z_gradient() -> None:
    trajectories = scored([3, 1, 6], seed=4)
    batch = collate(trajectories)
    tb = TrajectoryBalance(init_log_z=0.7)
    out = tb(batch)
    residuals = [0.7 + sum(t.delta_logp.tolist()) - float(t.log_reward) for t in trajectories]
    assert out.loss.item() == pytest.approx(sum(x * x for x in residuals) / 3)
    out.loss.backward()
    assert tb.log_z.grad.item() == pytest.approx(2 * sum(residuals) / 3)
    for traj, r in zip(trajectories, residuals, strict=True):  # dδ²/dΔℓ_t = 2δ, averaged
        torch.testing.assert_close(
            traj.delta_logp.grad, torch.full_like(traj.delta_logp, 2 * r / 3)
        )


def test_tb_is_the_full_path_span_of_anchortb() -> None:
    """With T = 1 the only span is (0, 1), so TB and AnchorTB agree when ũ(s_0) = log Z."""
    batch = collate(scored([1], seed=8))
    flows = torch.stack([torch.tensor(0.3, dtype=torch.float64), batch.log_reward[0]])
    anchortb_span = span_loss_loop(flows, batch.delta_logp[0], 1)
    tb_loss = TrajectoryBalance(init_log_z=0.3)(batch).loss
    assert tb_loss.item() == pytest.approx(anchortb_span.item())


def test_optimal_log_z_is_mean_log_reward_minus_log_ratio() -> None:
    batch = collate(scored([2, 5, 4, 3], seed=2))
    tb = build_objective("tb")
    opt = torch.optim.SGD(tb.parameters(), lr=0.2)
    for _ in range(200):
        opt.zero_grad()
        tb(batch).loss.backward()
        opt.step()
    sums = torch.where(batch.action_mask, batch.delta_logp, 0).sum(dim=1)
    assert tb.log_z.item() == pytest.approx((batch.log_reward - sums).mean().item(), abs=1e-6)
