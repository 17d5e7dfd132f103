"""How far π_θ has tilted from ρ toward the AnchorTB target, measured on ρ's own trajectories.

AnchorTB's target reweights ρ's histories by 1 + a_β r (docs/method.md §1.7, Prop. A.6), so a policy that
learned it gives ρ's successful trajectories a higher log-ratio log P_θ(τ)/P_ρ(τ) = Σ_t Δℓ_t
(the executor's terms cancel, A.4) than its failed ones. At initialization Δℓ ≡ 0 and the
report is exactly (AUC 1/2, gap 0). Scored on held-out trajectories this is a paired,
continuous test of learning with far more power than comparing sampled rewards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from evosteer_core.evaluation.ranking import auc
from evosteer_core.policy.orchestrator import Orchestrator


def trajectory_log_ratios(policy: Orchestrator, decisions: pd.DataFrame) -> pd.Series:
    """Σ_t (ℓ_θ − ℓ_ρ) of every trajectory in a decisions table, indexed by traj_id."""
    prompts = decisions["prompt"].tolist()
    actions = decisions["action"].tolist()
    legal = decisions["legal"].tolist()
    theta = policy.score(prompts, actions, legal, use_adapter=True)
    rho = policy.score(prompts, actions, legal, use_adapter=False)
    delta = pd.Series((theta - rho).double().cpu().numpy(), index=decisions["traj_id"].to_numpy())
    return delta.groupby(level=0, sort=False).sum()


@dataclass(frozen=True)
class TiltReport:
    """Separation of successful (reward ≥ 1/2) from failed trajectories by their log-ratio."""

    auc: float
    gap: float
    """Mean log-ratio of successes minus that of failures (nats)."""
    n_success: int
    n_failure: int


def tilt_report(rewards: Sequence[float], log_ratios: Sequence[float]) -> TiltReport:
    """AUC and mean gap of ``log_ratios`` between trajectories with reward ≥ 1/2 and the rest."""
    r = np.asarray(rewards, dtype=float)
    x = np.asarray(log_ratios, dtype=float)
    if r.shape != x.shape:
        raise ValueError(f"{len(r)} rewards but {len(x)} log-ratios")
    ok = r >= 0.5
    gap = float(x[ok].mean() - x[~ok].mean()) if ok.any() and (~ok).any() else float("nan")
    return TiltReport(auc(x, ok), gap, int(ok.sum()), int((~ok).sum()))


@dataclass(frozen=True)
class ReweightedGain:
    """θ's mean reward minus ρ's, estimated from ρ's trajectories alone (paired)."""

    gain: float
    se: float
    """Delta-method standard error."""


def reweighted_gain(rewards: Sequence[float], log_ratios: Sequence[float]) -> ReweightedGain:
    """E_θ[r] − E_ρ[r] by self-normalized importance weighting of ρ's own trajectories.

    P_θ(τ)/P_ρ(τ) = e^{w(τ)} with w = Σ Δℓ (the executor's terms cancel), so
    Σ r e^w / Σ e^w estimates θ's mean reward from the same episodes that give ρ's: the gain
    is paired and has much less noise than a comparison of separately sampled rewards while θ
    stays near ρ. The standard error linearizes R̂ − r̄ with influence v(r − R̂) − (r − r̄),
    v = e^w / mean e^w. With w ≡ 0 (untrained) the gain and its error are exactly 0.
    """
    r = np.asarray(rewards, dtype=float)
    w = np.asarray(log_ratios, dtype=float)
    if r.shape != w.shape:
        raise ValueError(f"{len(r)} rewards but {len(w)} log-ratios")
    v = np.exp(w - w.max())
    v /= v.mean()
    theta = float(np.mean(v * r))
    influence = v * (r - theta) - (r - r.mean())
    se = float(np.sqrt(np.var(influence, ddof=1) / len(r))) if len(r) > 1 else float("nan")
    return ReweightedGain(theta - float(r.mean()), se)


def tilt_gain(mu: float, var: float, beta: float) -> float:
    """Prop. A.6 on one task: the mean-reward gain of ρ reweighted by 1 + a_β p(τ),
    a_β Var_ρ(p) / (1 + a_β μ), for success probabilities p(τ) with mean μ and variance var."""
    a = math.expm1(beta)
    return a * var / (1 + a * mu)


def success_variance(p_hats: Sequence[float], replays: int) -> float:
    """Var_ρ(p) estimated from p̂(τ), each the mean of ``replays`` Bernoulli(p(τ)) draws: the
    sample variance of p̂ minus its binomial part E[p(1 − p)]/K (estimated without bias by
    mean p̂(1 − p̂)/(K − 1)), clipped at 0."""
    if replays < 2 or len(p_hats) < 2:
        raise ValueError(
            f"need >= 2 replays and >= 2 trajectories, got {replays} and {len(p_hats)}"
        )
    p = np.asarray(p_hats, dtype=float)
    noise = float(np.mean(p * (1 - p))) / (replays - 1)
    return max(0.0, float(np.var(p, ddof=1)) - noise)
