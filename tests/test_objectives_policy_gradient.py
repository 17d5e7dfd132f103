"""PPO and GRPO against independent computations: GAE by its explicit sum, the surrogate's
gradient by finite differences and the softmax score, clipping, hand-computed group
advantages, and the KL/entropy estimators by exact enumeration of a small legal set."""

from __future__ import annotations

import math

import pytest
import torch

from evosteer_core.objectives import GRPO, PPO, TrajectoryBatch
from evosteer_core.objectives.grpo import group_advantages
from evosteer_core.objectives.policy_gradient import clipped_surrogate, k3, kl_to_reference
from evosteer_core.objectives.ppo import gae


def explicit_gae(r: list[float], v: list[float], gamma: float, lam: float) -> list[float]:
    """A_t = Σ_l (γλ)^l δ_{t+l}, δ_t = r_t + γ V_{t+1} − V_t, V_T = 0, written as the sum."""
    n = len(r)
    vv = v + [0.0]
    deltas = [r[t] + gamma * vv[t + 1] - vv[t] for t in range(n)]
    return [sum((gamma * lam) ** k * deltas[t + k] for k in range(n - t)) for t in range(n)]


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)])
def test_gae_recursion_equals_the_explicit_sum(gamma, lam):
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1, 4, 7, 3])
    rewards = torch.rand(4, 7, generator=g, dtype=torch.float64)
    values = torch.rand(4, 7, generator=g, dtype=torch.float64)
    got = gae(rewards, values, lengths, gamma, lam)
    for b, n in enumerate(lengths.tolist()):
        want = explicit_gae(rewards[b, :n].tolist(), values[b, :n].tolist(), gamma, lam)
        assert got[b, :n].tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)
        assert (got[b, n:] == 0).all()


def softmax_logp(theta: torch.Tensor, actions: list[int]) -> torch.Tensor:
    """ℓ of each chosen action; state t has logits theta[t] (a tabular policy)."""
    return torch.log_softmax(theta, dim=-1)[torch.arange(len(actions)), torch.tensor(actions)]


def test_ppo_gradient_at_ratio_one_is_the_advantage_weighted_score():
    g = torch.Generator().manual_seed(1)
    theta0 = torch.randn(5, 4, generator=g, dtype=torch.float64)
    actions = [0, 3, 1, 1, 2]
    adv = torch.randn(5, generator=g, dtype=torch.float64)
    old = softmax_logp(theta0, actions).detach()

    def surrogate(theta: torch.Tensor) -> float:
        return float(clipped_surrogate(softmax_logp(theta, actions), old, adv, 0.2).mean())

    h = 1e-6
    numeric = torch.zeros_like(theta0)
    for idx in range(theta0.numel()):
        e = torch.zeros_like(theta0).view(-1)
        e[idx] = h
        e = e.view_as(theta0)
        numeric.view(-1)[idx] = (surrogate(theta0 + e) - surrogate(theta0 - e)) / (2 * h)
    # advantage-weighted score, by the softmax formula ∂ℓ/∂θ_t = onehot(a_t) − π_t
    pi = torch.softmax(theta0, dim=-1)
    score = torch.nn.functional.one_hot(torch.tensor(actions), 4).double() - pi
    expected = -(adv[:, None] * score) / len(actions)
    assert torch.allclose(numeric, expected, atol=1e-8)


def test_clipped_units_get_exactly_zero_gradient():
    eps = 0.2
    # (log ratio, advantage) per unit; clip binds when r left [0.8, 1.2] on A's side
    cases = [
        (math.log(1.5), 1.0, True),
        (math.log(1.1), 1.0, False),
        (math.log(0.5), 1.0, False),
        (math.log(0.5), -1.0, True),
        (math.log(1.5), -1.0, False),
        (math.log(0.9), -2.0, False),
    ]
    logp = torch.tensor([c[0] for c in cases], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([c[1] for c in cases], dtype=torch.float64)
    clipped_surrogate(logp, torch.zeros(len(cases), dtype=torch.float64), adv, eps).sum().backward()
    for i, (lr, a, binds) in enumerate(cases):
        if binds:
            assert logp.grad[i].item() == 0.0
        else:  # ∂(−rA)/∂ℓ = −A r
            assert logp.grad[i].item() == pytest.approx(-a * math.exp(lr), rel=1e-12)


def test_grpo_advantages_on_hand_computed_groups():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.2, 0.0, 0.5, 1.0, 0.25, 0.25])
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 3, 4, 4])
    adv = group_advantages(rewards, groups)
    s = 1 / math.sqrt(2)  # [1, 0]: mean 1/2, Bessel std sqrt(1/2)
    want = [s, -s, 0, 0, 0, 0, -1, 0, 1, 0, 0]  # [0, .5, 1]: std 0.5; all-equal and lone → 0
    assert adv.tolist() == pytest.approx(want, abs=1e-6)


def small_legal_set(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(5, generator=g, dtype=torch.float64),
        torch.log_softmax(torch.randn(5, generator=g, dtype=torch.float64), 0),
    )


def test_k3_mean_is_the_kl_and_the_kl_term_gradient_is_the_kl_gradient():
    theta, log_rho = small_legal_set(2)
    log_pi = torch.log_softmax(theta, 0)
    pi = log_pi.exp()
    kl = float((pi * (log_pi - log_rho)).sum())
    # E_π[k3] over the five legal actions, by enumeration
    assert float((pi * k3(log_pi - log_rho)).sum()) == pytest.approx(kl, rel=1e-12)
    # gradient of the KL term, each action's term weighted by its (fixed) probability
    th = theta.clone().requires_grad_(True)
    delta = torch.log_softmax(th, 0) - log_rho
    (pi.detach() * kl_to_reference(delta)).sum().backward()
    # exact ∇_θ KL(π‖ρ) for a softmax: π_j (log π_j/ρ_j − KL)
    exact = pi * ((log_pi - log_rho) - kl)
    assert torch.allclose(th.grad, exact, atol=1e-12)
    # k3's own gradient with the samples fixed is the reverse KL's, π − ρ: not the same
    th2 = theta.clone().requires_grad_(True)
    (pi.detach() * k3(torch.log_softmax(th2, 0) - log_rho)).sum().backward()
    assert torch.allclose(th2.grad, pi - log_rho.exp(), atol=1e-12)
    assert not torch.allclose(th2.grad, exact, atol=1e-3)


def test_ppo_entropy_surrogate_mean_and_gradient_by_enumeration():
    theta, _ = small_legal_set(3)
    log_pi = torch.log_softmax(theta, 0)
    pi = log_pi.exp()
    entropy = float(-(pi * log_pi).sum())
    assert float((pi * -log_pi).sum()) == pytest.approx(entropy)
    th = theta.clone().requires_grad_(True)
    (pi.detach() * -0.5 * torch.log_softmax(th, 0).pow(2)).sum().backward()
    exact = -pi * (log_pi + entropy)  # ∂H/∂θ_j for a softmax
    assert torch.allclose(th.grad, exact, atol=1e-12)


def policy_batch(seed: int, garbage: float = 0.0) -> TrajectoryBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([3, 1, 4, 2])
    n_b, n_t = 4, 4
    mask = torch.arange(n_t)[None, :] < lengths[:, None]

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x, torch.full_like(x, garbage))

    ref = pad(-torch.rand(n_b, n_t, generator=g))
    delta = pad(0.1 * torch.randn(n_b, n_t, generator=g))
    return TrajectoryBatch(
        delta_logp=delta,
        action_mask=mask,
        lengths=lengths,
        u=torch.zeros(n_b),
        c=torch.zeros(n_b, n_t + 1),
        b=torch.zeros(n_b, n_t + 1),
        log_reward=torch.zeros(n_b),
        logp=pad(delta + ref),
        ref_logp=ref,
        old_logp=pad(ref + 0.05 * torch.randn(n_b, n_t, generator=g)),
        rewards=torch.tensor([1.0, 0.0, 0.5, 1.0]),
        group_ids=torch.tensor([0, 0, 1, 1]),
        state_inputs=torch.randn(n_b, n_t, 6, generator=g),
    )


@pytest.mark.parametrize("make", [lambda: PPO(6, seed=0), lambda: GRPO()])
def test_padding_never_changes_the_loss(make):
    objective = make()
    clean = objective(policy_batch(5)).loss
    dirty = objective(policy_batch(5, garbage=1e3)).loss
    assert torch.isfinite(dirty)
    assert float(clean.detach()) == pytest.approx(float(dirty.detach()), rel=1e-6)


def test_grpo_loss_by_hand_on_one_batch():
    batch = policy_batch(7)
    out = GRPO(clip=0.2, kl_coef=0.1)(batch)
    adv = group_advantages(batch.rewards, batch.group_ids)
    total = 0.0
    for b, n in enumerate(batch.lengths.tolist()):
        acc = 0.0
        for t in range(n):
            r = math.exp(float(batch.logp[b, t] - batch.old_logp[b, t]))
            a = float(adv[b])
            d = float(batch.delta_logp[b, t])
            acc += -min(r * a, min(max(r, 0.8), 1.2) * a) + 0.1 * r * (math.exp(-d) + d - 1)
        total += acc / n
    assert float(out.loss) == pytest.approx(total / 4, rel=1e-5)


def test_ppo_critic_learns_through_the_loss_and_is_checkpointed():
    objective = PPO(6, seed=3)
    batch = policy_batch(9)
    objective(batch).loss.backward()
    assert objective.critic.net[2].weight.grad.abs().sum() > 0
    again = PPO(6, seed=3)
    assert all(
        torch.equal(a, b)
        for a, b in zip(objective.state_dict().values(), again.state_dict().values(), strict=True)
    )
