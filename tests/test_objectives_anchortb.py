"""AnchorTB against independent computations: the span sum, autograd, G_T, Prop. B.9."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from objective_oracle import (
    span_coefficients_loop,
    span_incidence,
    span_loss_loop,
    span_loss_matrix,
)

from evosteer_core.objectives import (
    AnchorTB,
    TrajectoryBatch,
    action_coefficients,
    build_objective,
    implemented_flows,
    objective_names,
    register_objective,
    trajectory_losses,
)

BETA = 2.0


def random_batch(lengths: list[int], seed: int, *, requires_grad: bool = False) -> TrajectoryBatch:
    """A padded float64 batch with random Δℓ, anchors, corrections, b and rewards.

    Padding entries hold large garbage so that any leak of padding into the loss shows.
    """
    gen = torch.Generator().manual_seed(seed)
    n_b, n_t = len(lengths), max(lengths)
    lens = torch.tensor(lengths)
    mask = torch.arange(n_t)[None, :] < lens[:, None]
    garbage = torch.full((n_b, n_t + 1), 1e3, dtype=torch.float64)
    state_mask = torch.arange(n_t + 1)[None, :] <= lens[:, None]
    delta = torch.where(
        mask, torch.randn(n_b, n_t, generator=gen, dtype=torch.float64), garbage[:, :n_t]
    )
    b = torch.where(
        state_mask, 0.3 * torch.randn(n_b, n_t + 1, generator=gen, dtype=torch.float64), garbage
    )
    rewards = torch.rand(n_b, generator=gen, dtype=torch.float64)
    return TrajectoryBatch(
        delta_logp=delta.requires_grad_(requires_grad),
        action_mask=mask,
        lengths=lens,
        u=BETA * torch.rand(n_b, generator=gen, dtype=torch.float64),
        c=0.25 * (2 * torch.rand(n_b, n_t + 1, generator=gen, dtype=torch.float64) - 1),
        b=b.requires_grad_(requires_grad),
        log_reward=torch.log1p(math.expm1(BETA) * rewards),
        rewards=rewards,
    )


def flows_by_definition(batch: TrajectoryBatch, row: int) -> list[float]:
    """ũ of one trajectory written out from Definition B.1, scalar by scalar."""
    length = int(batch.lengths[row])
    out = []
    for i in range(length):
        measured = min(BETA, max(0.0, float(batch.u[row]) + float(batch.c[row, i])))
        out.append(measured + float(batch.b[row, i]))
    out.append(float(batch.log_reward[row]))
    return out


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 10), min_size=1, max_size=6), seed=st.integers(0, 2**31))
def test_o_t_loss_equals_explicit_loop(lengths: list[int], seed: int) -> None:
    batch = random_batch(lengths, seed)
    flows = implemented_flows(batch, BETA)
    fast = trajectory_losses(flows, batch.delta_logp, batch.lengths)
    for row, length in enumerate(lengths):
        defined = torch.tensor(flows_by_definition(batch, row), dtype=torch.float64)
        slow = span_loss_loop(defined, batch.delta_logp[row], length)
        assert fast[row].item() == pytest.approx(slow.item(), rel=1e-10, abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=8), seed=st.integers(0, 2**31))
def test_o_t_loss_equals_span_matrix_mixed_lengths(lengths: list[int], seed: int) -> None:
    batch = random_batch(lengths, seed)
    flows = implemented_flows(batch, BETA)
    fast = trajectory_losses(flows, batch.delta_logp, batch.lengths)
    spans = span_loss_matrix(flows, batch.delta_logp, batch.lengths)
    torch.testing.assert_close(fast, spans, rtol=1e-10, atol=1e-10)


def test_o_t_loss_equals_loop_at_t64() -> None:
    batch = random_batch([64, 3], seed=7)
    flows = implemented_flows(batch, BETA)
    fast = trajectory_losses(flows, batch.delta_logp, batch.lengths)
    assert fast[0].item() == pytest.approx(
        span_loss_loop(flows[0], batch.delta_logp[0], 64).item(), rel=1e-10
    )


def test_span_forms_agree() -> None:
    batch = random_batch([1, 2, 5, 9], seed=3)
    flows = implemented_flows(batch, BETA)
    spans = span_loss_matrix(flows, batch.delta_logp, batch.lengths)
    for row, length in enumerate([1, 2, 5, 9]):
        loop = span_loss_loop(flows[row], batch.delta_logp[row], length)
        assert spans[row].item() == pytest.approx(loop.item(), rel=1e-12)


def test_padding_does_not_change_a_trajectory_loss() -> None:
    alone = random_batch([5], seed=11)
    padded = random_batch([5, 17, 2], seed=11)
    # same first trajectory values in both, then padding on the longer batch
    padded.delta_logp.data[0, :5] = alone.delta_logp[0]
    padded.b.data[0, :6] = alone.b[0]
    padded.c[0, :6] = alone.c[0]
    padded.u[0], padded.log_reward[0] = alone.u[0], alone.log_reward[0]
    a = trajectory_losses(implemented_flows(alone, BETA), alone.delta_logp, alone.lengths)[0]
    p = trajectory_losses(implemented_flows(padded, BETA), padded.delta_logp, padded.lengths)[0]
    assert a.item() == pytest.approx(p.item(), rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=5), seed=st.integers(0, 2**31))
def test_gamma_equals_autograd_and_span_loop(lengths: list[int], seed: int) -> None:
    batch = random_batch(lengths, seed, requires_grad=True)
    flows = implemented_flows(batch, BETA)
    per_traj = trajectory_losses(flows, batch.delta_logp, batch.lengths)
    (grad,) = torch.autograd.grad(per_traj.sum(), batch.delta_logp)
    gamma = action_coefficients(flows.detach(), batch.delta_logp.detach(), batch.lengths)
    torch.testing.assert_close(gamma, grad, rtol=1e-10, atol=1e-10)
    for row, length in enumerate(lengths):
        loop = span_coefficients_loop(flows[row].detach(), batch.delta_logp[row].detach(), length)
        torch.testing.assert_close(gamma[row, :length], loop, rtol=1e-10, atol=1e-10)
        assert torch.all(grad[row, length:] == 0)


@pytest.mark.parametrize("length", [1, 2, 3, 7, 16])
def test_hessian_in_delta_logp_is_2_g_t_over_k_t(length: int) -> None:
    batch = random_batch([length], seed=length)
    flows = implemented_flows(batch, BETA).detach()

    def loss_of(delta: torch.Tensor) -> torch.Tensor:
        return trajectory_losses(flows, delta[None, :], batch.lengths)[0]

    hessian = torch.autograd.functional.hessian(loss_of, batch.delta_logp[0].detach())
    k_t = length * (length + 1) / 2
    g = torch.tensor(
        [[(min(r, s) + 1) * (length - max(r, s)) for s in range(length)] for r in range(length)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(hessian, 2.0 * g / k_t, rtol=1e-10, atol=1e-10)
    # G_T = A_T^T A_T with the span incidence, and it is positive definite
    _, _, incidence = span_incidence(length)
    torch.testing.assert_close(incidence.T @ incidence, g)
    assert torch.linalg.eigvalsh(g).min() > 0
    # quadratic form and lower bound (A.20–A.21) with e_t = ũ_t + Δℓ_t − ũ_{t+1}
    delta = batch.delta_logp[0].detach()
    e = flows[0, :length] + delta - flows[0, 1 : length + 1]
    loss = loss_of(delta)
    assert loss.item() == pytest.approx((e @ g @ e / k_t).item(), rel=1e-10)
    assert loss.item() >= (e @ e / k_t).item() - 1e-12


def one_action_batch(roots: torch.Tensor) -> TrajectoryBatch:
    """Prop. B.9's executor: for each root u0, two T = 1 trajectories with r = 0 and r = 1.

    Both policies give the single action probability one, so Δℓ = 0; the scalar root is carried
    by b at state 0 (u = c = 0, so the measured part is 0).
    """
    n = 2 * roots.shape[0]
    b = torch.zeros(n, 2, dtype=torch.float64)
    b[:, 0] = roots.repeat_interleave(2)
    return TrajectoryBatch(
        delta_logp=torch.zeros(n, 1, dtype=torch.float64),
        action_mask=torch.ones(n, 1, dtype=torch.bool),
        lengths=torch.ones(n, dtype=torch.long),
        u=torch.zeros(n, dtype=torch.float64),
        c=torch.zeros(n, 2, dtype=torch.float64),
        b=b,
        log_reward=torch.tensor([0.0, BETA], dtype=torch.float64).repeat(roots.shape[0]),
    )


def test_b9_one_action_executor_root_minimum() -> None:
    """Prop. B.9: E loss(u0) over the two equiprobable outcomes is minimised at β/2, min β²/4."""
    grid = torch.linspace(-1.0, 3.0, 801, dtype=torch.float64)
    batch = one_action_batch(grid)
    per_traj = trajectory_losses(implemented_flows(batch, BETA), batch.delta_logp, batch.lengths)
    expected_loss = per_traj.view(-1, 2).mean(dim=1)
    best = int(torch.argmin(expected_loss))
    assert grid[best].item() == pytest.approx(BETA / 2, abs=1e-9)
    assert expected_loss[best].item() == pytest.approx(BETA**2 / 4, abs=1e-12)
    torch.testing.assert_close(expected_loss, (grid - BETA / 2) ** 2 + BETA**2 / 4)
    # the objective itself, at the optimum and at the ideal root log((1 + e^β)/2)
    ideal_root = math.log((1 + math.exp(BETA)) / 2)
    at_opt = AnchorTB(beta=BETA)(one_action_batch(torch.tensor([BETA / 2], dtype=torch.float64)))
    at_ideal = AnchorTB(beta=BETA)(
        one_action_batch(torch.tensor([ideal_root], dtype=torch.float64))
    )
    assert at_opt.loss.item() == pytest.approx(BETA**2 / 4)
    assert at_ideal.loss.item() > at_opt.loss.item() + 0.1


def test_terminal_flow_ignores_b_and_measured_terms_get_no_gradient() -> None:
    lengths = [3, 6, 1]
    batch = random_batch(lengths, seed=5, requires_grad=True)
    batch.u.requires_grad_(True)
    batch.c.requires_grad_(True)
    batch.log_reward.requires_grad_(True)
    out = AnchorTB(beta=BETA)(batch)
    out.loss.backward()
    for row, length in enumerate(lengths):
        assert batch.b.grad[row, length] == 0  # terminal overridden by log R_β
        assert torch.all(batch.b.grad[row, length + 1 :] == 0)  # padding
        assert torch.all(batch.b.grad[row, :length] != 0)
    assert batch.u.grad is None and batch.c.grad is None and batch.log_reward.grad is None
    assert batch.delta_logp.grad is not None


def test_flows_clip_measured_part_and_keep_terminal() -> None:
    batch = random_batch([4, 2], seed=9)
    batch.u[:] = torch.tensor([1.9, 0.1], dtype=torch.float64)
    batch.c[:] = torch.tensor([[0.25, -0.25, 0.2, 0.0, 0.0], [-0.25, 0.1, 0.3, 0.0, 0.0]])
    flows = implemented_flows(batch, BETA)
    for row in range(2):
        expected = flows_by_definition(batch, row)
        torch.testing.assert_close(
            flows[row, : len(expected)], torch.tensor(expected, dtype=torch.float64)
        )
    assert torch.all(flows[1, 3:] == 0)


def test_metrics_anchor_only_level() -> None:
    batch = random_batch([4, 7, 2], seed=21)
    out = AnchorTB(beta=BETA)(batch)
    zero = TrajectoryBatch(
        delta_logp=torch.zeros_like(batch.delta_logp),
        action_mask=batch.action_mask,
        lengths=batch.lengths,
        u=batch.u,
        c=batch.c,
        b=torch.zeros_like(batch.b),
        log_reward=batch.log_reward,
    )
    zero_out = AnchorTB(beta=BETA)(zero)
    assert out.metrics["anchor_only_loss"] == pytest.approx(zero_out.metrics["loss"], rel=1e-12)
    assert zero_out.metrics["anchor_only_loss"] == pytest.approx(
        zero_out.metrics["loss"], rel=1e-12
    )
    valid = batch.delta_logp[batch.action_mask]
    assert out.metrics["mean_abs_delta_logp"] == pytest.approx(valid.abs().mean().item())
    nonterminal = batch.state_mask() & ~batch.terminal_mask()
    assert out.metrics["mean_b"] == pytest.approx(batch.b[nonterminal].mean().item())
    assert out.metrics["loss"] == pytest.approx(out.loss.item())


def test_registry_builds_by_name_and_rejects_unknown_or_duplicate() -> None:
    assert "anchortb" in objective_names()
    objective = build_objective("anchortb", beta=1.5)
    assert isinstance(objective, AnchorTB) and objective.beta == 1.5
    with pytest.raises(ValueError, match="unknown objective 'nope'"):
        build_objective("nope")
    with pytest.raises(ValueError, match="registered twice"):

        @register_objective
        class Again(AnchorTB):
            name = "anchortb"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: setattr(b, "lengths", torch.tensor([0, 2])), r"lengths\[0\] = 0"),
        (lambda b: setattr(b, "lengths", torch.tensor([3, 5])), r"lengths\[1\] = 5"),
        (lambda b: b.action_mask.__setitem__((1, 0), False), "action_mask row 1"),
        (lambda b: setattr(b, "c", torch.zeros(2, 3)), r"c: expected shape \(2, 4\)"),
        (lambda b: setattr(b, "u", torch.tensor([float("nan"), 0.0])), "u: contains non-finite"),
    ],
)
def test_batch_validation_names_the_field(mutate, message: str) -> None:
    batch = random_batch([3, 2], seed=1)
    mutate(batch)
    with pytest.raises(ValueError, match=message):
        AnchorTB(beta=BETA)(batch)


def test_objective_checks_required_fields() -> None:
    class NeedsRewards(AnchorTB):
        name = "needs_rewards_test"
        requires = ("rewards", "group_ids")

    with pytest.raises(ValueError, match=r"needs batch fields \['group_ids'\]"):
        NeedsRewards()(random_batch([2], seed=0))
