"""PPO (Schulman et al., 2017) on the orchestrator's actions, with its own critic.

Per step, on the θ rollouts only (the data PPO's ratio is defined for):

    r_t = exp(ℓ_θ(a_t|s_t) − ℓ_old(a_t|s_t))            ℓ_old: ``logp_sample`` at rollout
    δ_t = r_t^env + γ V(s_{t+1}) − V(s_t),  V(s_T) = 0,  r_t^env = r(x)·1{t = T−1}
    A_t = Σ_{l≥0} (γλ)^l δ_{t+l}                          (GAE, by the backward recursion)
    L = mean_t −min(r_t A_t, clip(r_t) A_t) + c_V mean_t (V(s_t) − (A_t + V(s_t)))² − c_H Ĥ

Means run over every action of the batch. The critic V_φ is a head over [h_ρ(s); f(s)] that
the objective owns (its parameters travel in the train state's ``objective`` field). The
entropy bonus uses the sampled action: E_{a∼π}[−ℓ(a)] = H(π(·|s)) over the legal set and
E_{a∼π}[∇(−½ℓ(a)²)] = ∇H, so the surrogate ½·sg(r)·ℓ² costs nothing beyond ℓ_θ
(docs/objectives.md §8 has the choices and their tests).
"""

from __future__ import annotations

import hashlib
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
from evosteer_core.objectives.policy_gradient import clipped_fraction, clipped_surrogate

FEATURE_DIM = 30
"""Length of f(s), the execution features in the critic's input [h_ρ; f]."""


def gae(rewards: Tensor, values: Tensor, lengths: Tensor, gamma: float, lam: float) -> Tensor:
    """A_t [B, T] by A_t = δ_t + γλ A_{t+1} from t = T−1 down, V(s_T) = 0 and A_T = 0.

    ``rewards`` and ``values`` are [B, T] per action and per decision state; entries at
    t ≥ lengths[b] are ignored and come back 0."""
    n_t = rewards.shape[1]
    mask = torch.arange(n_t, device=lengths.device)[None, :] < lengths[:, None]
    values = torch.where(mask, values, torch.zeros_like(values))
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in range(n_t - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        adv = torch.where(mask[:, t], adv, torch.zeros_like(adv))
        advantages[:, t] = adv
        next_value, next_adv = values[:, t], adv
    return advantages


def terminal_rewards(batch: TrajectoryBatch) -> Tensor:
    """[B, T]: r(x) on each trajectory's last action, 0 elsewhere (the reward is terminal)."""
    last = torch.arange(batch.max_actions, device=batch.lengths.device)[None, :] == (
        batch.lengths[:, None] - 1
    )
    return torch.where(last, batch.rewards[:, None], torch.zeros_like(batch.delta_logp)).detach()


class Critic(nn.Module):
    """V_φ(s) = Linear(D, hidden) → GELU → Linear(hidden, 1) on [h_ρ(s); f(s)].

    Seeded init (PyTorch's default law U(±1/√fan_in) drawn from its own generator, the global
    RNG untouched); the last layer starts at zero, so V ≡ 0 and the first advantages are the
    discounted returns."""

    def __init__(self, in_dim: int, hidden: int, seed: int) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, 1))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            first, last = self.net[0], self.net[2]
            bound = 1.0 / in_dim**0.5
            first.weight.uniform_(-bound, bound, generator=gen)
            first.bias.uniform_(-bound, bound, generator=gen)
            last.weight.zero_()
            last.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(-1)


@register_objective
class PPO(Objective):
    """Clipped-surrogate PPO with GAE, a value loss for its critic and an entropy bonus.

    Metrics: ``loss``, ``policy_loss``, ``value_loss``, ``entropy`` (mean −ℓ_θ of the sampled
    actions: the legal-set entropy's estimate), ``clip_fraction``, ``mean_ratio``,
    ``mean_advantage``, ``mean_value``.
    """

    name = "ppo"
    requires = ("logp", "old_logp", "rewards", "state_inputs")
    arms = ("theta",)

    def __init__(
        self,
        in_dim: int,
        *,
        clip: float = 0.2,
        gamma: float = 1.0,
        lam: float = 0.95,
        value_coef: float = 0.5,
        entropy_coef: float = 0.01,
        critic_hidden: int = 128,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.clip, self.gamma, self.lam = float(clip), float(gamma), float(lam)
        self.value_coef, self.entropy_coef = float(value_coef), float(entropy_coef)
        self.critic = Critic(in_dim, critic_hidden, seed)

    @classmethod
    def from_config(cls, cfg: Any, *, hidden_size: int | None = None) -> PPO:
        """Settings from ``objectives.ppo``; the critic reads [h_ρ; f], so d_h is needed."""
        if hidden_size is None:
            raise ValueError("ppo: its critic reads h_ρ, so hidden_size (d_h) must be given")
        p = cfg.objectives.ppo
        seed = (
            int.from_bytes(
                hashlib.sha256(f"{cfg.train.seed}/ppo_critic".encode()).digest()[:8], "big"
            )
            >> 1
        )
        return cls(
            hidden_size + FEATURE_DIM,
            clip=p.clip,
            gamma=p.gamma,
            lam=p.lam,
            value_coef=p.value_coef,
            entropy_coef=p.entropy_coef,
            critic_hidden=p.critic_hidden,
            seed=seed,
        )

    def compute(self, batch: TrajectoryBatch) -> ObjectiveOutput:
        mask = batch.action_mask
        zero = torch.zeros_like(batch.delta_logp)
        logp = torch.where(mask, batch.logp, zero)
        old = torch.where(mask, batch.old_logp, zero)
        values = self.critic(batch.state_inputs)
        with torch.no_grad():
            advantages = gae(
                terminal_rewards(batch), values.detach(), batch.lengths, self.gamma, self.lam
            )
            returns = advantages + values.detach()
        policy_loss = masked_mean(clipped_surrogate(logp, old, advantages, self.clip), mask)
        value_loss = masked_mean((values - returns).pow(2), mask)
        ratio = torch.exp(logp.detach() - old.detach())
        entropy_surrogate = masked_mean(0.5 * ratio * logp.pow(2), mask)
        loss = policy_loss + self.value_coef * value_loss + self.entropy_coef * entropy_surrogate
        with torch.no_grad():
            metrics = {
                "loss": float(loss),
                "policy_loss": float(policy_loss),
                "value_loss": float(value_loss),
                "entropy": float(masked_mean(-logp, mask)),
                "clip_fraction": float(masked_mean(clipped_fraction(logp, old, self.clip), mask)),
                "mean_ratio": float(masked_mean(ratio, mask)),
                "mean_advantage": float(masked_mean(advantages, mask)),
                "mean_value": float(masked_mean(values, mask)),
            }
        return ObjectiveOutput(loss=loss, metrics=metrics)
