"""The AUC (evosteer_core.evaluation.ranking) and the learned-tilt report (experiments/tilt.py)
against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from evosteer_core.evaluation.ranking import auc
from experiments.tilt import (
    reweighted_gain,
    success_variance,
    tilt_gain,
    tilt_report,
)


def test_auc_equals_mann_whitney_u_over_pairs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = np.round(rng.normal(size=40), 1)  # rounding makes ties
        labels = rng.random(40) < 0.4
        u = mannwhitneyu(scores[labels], scores[~labels]).statistic
        assert auc(scores, labels) == pytest.approx(u / (labels.sum() * (~labels).sum()))


def test_auc_is_nan_with_one_class() -> None:
    assert math.isnan(auc([1.0, 2.0], [1, 1]))


def test_untrained_policy_reports_no_tilt() -> None:
    report = tilt_report([1.0, 0.0, 1.0, 0.0, 0.0], [0.0] * 5)
    assert (report.auc, report.gap, report.n_success, report.n_failure) == (0.5, 0.0, 2, 3)


def test_perfect_separation_and_gap() -> None:
    report = tilt_report([1.0, 0.0, 1.0, 0.0], [0.5, -1.0, 1.5, 0.0])
    assert report.auc == 1.0
    assert report.gap == pytest.approx(1.0 - (-0.5))


def test_length_mismatch_is_named() -> None:
    with pytest.raises(ValueError, match="3 rewards but 2 log-ratios"):
        tilt_report([1.0, 0.0, 1.0], [0.0, 0.0])


def test_tilt_gain_equals_the_reweighted_bandit_by_brute_force() -> None:
    """ρ over actions with success probabilities p_a; θ* ∝ ρ(1 + a_β p_a) earns Σθ* p."""
    rng = np.random.default_rng(1)
    for beta in (0.5, 2.0, 8.0):
        rho = rng.dirichlet(np.ones(7))
        p = rng.random(7)
        target = rho * (1 + math.expm1(beta) * p)
        gain = float((target / target.sum()) @ p - rho @ p)
        mu = float(rho @ p)
        var = float(rho @ (p - mu) ** 2)
        assert tilt_gain(mu, var, beta) == pytest.approx(gain, rel=1e-9)


def test_success_variance_removes_the_binomial_noise() -> None:
    rng = np.random.default_rng(2)
    p = rng.uniform(0.1, 0.9, size=40)
    estimates = [success_variance(rng.binomial(8, p) / 8, 8) for _ in range(3000)]
    assert np.mean(estimates) == pytest.approx(np.var(p, ddof=1), rel=0.05)
    naive = np.var(rng.binomial(8, p) / 8, ddof=1)
    assert naive > 1.3 * np.var(p, ddof=1)  # without the correction it is biased upward


def test_success_variance_needs_replays() -> None:
    with pytest.raises(ValueError, match="need >= 2 replays"):
        success_variance([0.5, 0.5], 1)


def _bandit(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ρ over 6 action sequences, their success probabilities and a θ tilted from ρ."""
    rho = rng.dirichlet(np.ones(6))
    p = rng.uniform(0.05, 0.95, size=6)
    w = rng.normal(0.0, 0.4, size=6)
    theta = rho * np.exp(w)
    return rho, p, np.log(theta / theta.sum() / rho)


def test_reweighted_gain_is_consistent_and_its_error_matches_repetitions() -> None:
    """Sample ρ's trajectories of a bandit; the estimate approaches Σθp − Σρp exactly
    computed, and its delta-method error matches the spread over repeated samples."""
    rng = np.random.default_rng(5)
    rho, p, log_ratio = _bandit(rng)
    exact = float((rho * np.exp(log_ratio)) @ p - rho @ p)
    gains, ses = [], []
    for _ in range(2000):
        a = rng.choice(6, size=400, p=rho)
        r = (rng.random(400) < p[a]).astype(float)
        est = reweighted_gain(r, log_ratio[a])
        gains.append(est.gain)
        ses.append(est.se)
    assert np.mean(gains) == pytest.approx(exact, abs=0.004)
    assert np.mean(ses) == pytest.approx(np.std(gains), rel=0.1)
    # paired: far less noise than comparing two separately sampled means of 400 episodes
    assert np.std(gains) < 0.5 * math.sqrt(2 * 0.25 / 400)


def test_reweighted_gain_is_zero_at_initialization_and_checks_lengths() -> None:
    est = reweighted_gain([1.0, 0.0, 1.0, 0.0, 0.0], [0.0] * 5)
    assert (est.gain, est.se) == (0.0, 0.0)
    assert reweighted_gain([1.0, 0.0], [1.0, -1.0]).gain > 0
    with pytest.raises(ValueError, match="2 rewards but 3 log-ratios"):
        reweighted_gain([1.0, 0.0], [0.0, 0.0, 0.0])
