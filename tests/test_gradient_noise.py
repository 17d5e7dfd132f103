"""experiments/gradient_noise.py: the noise-scale estimates against a brute force and a known
Gaussian, and one draw of a step's gradient (deterministic, from the state, unclipped)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from evosteer_core.episode.world import build_world
from evosteer_core.infra.config import load_config
from evosteer_core.training.session import init_state
from experiments.gradient_noise import (
    UNCLIPPED,
    drift_cosines,
    lora_vector,
    noise_scale,
    step_gradient,
)


def test_signal_is_the_mean_inner_product_of_distinct_draws_and_cosine_their_mean_angle():
    g = np.random.default_rng(0).normal(size=(5, 7)) + 0.3
    est = noise_scale(g)
    pairs = list(itertools.permutations(range(5), 2))
    assert est.signal == pytest.approx(np.mean([g[k] @ g[m] for k, m in pairs]), rel=1e-12)
    cosines = [g[k] @ g[m] / np.linalg.norm(g[k]) / np.linalg.norm(g[m]) for k, m in pairs]
    assert est.mean_cosine == pytest.approx(np.mean(cosines), rel=1e-12)
    # the noise: the mean squared distance of two draws is twice one draw's variance
    assert est.noise == pytest.approx(np.mean([np.sum((g[k] - g[m]) ** 2) for k, m in pairs]) / 2)


def test_estimates_are_unbiased_for_gaussian_draws_of_known_mean_and_covariance():
    rng = np.random.default_rng(1)
    p, k, reps, sigma = 40, 4, 4000, 0.5
    mu = rng.normal(size=p) * 0.2  # |μ|² ≈ 1.6, tr C = 10: an SNR of about 0.16
    est = [noise_scale(mu + sigma * rng.normal(size=(k, p))) for _ in range(reps)]
    signal = np.array([e.signal for e in est])
    noise = np.array([e.noise for e in est])
    se = lambda x: x.std(ddof=1) / np.sqrt(reps)  # noqa: E731
    assert abs(signal.mean() - mu @ mu) < 4 * se(signal)
    assert abs(noise.mean() - p * sigma**2) < 4 * se(noise)
    assert est[0].batch_for_snr_one(10.0) == pytest.approx(10.0 * est[0].noise / est[0].signal)


def test_jackknife_errors_are_conservative_by_less_than_two_thirds_at_a_low_snr():
    """The delete-one jackknife overstates a variance (Efron and Stein, 1981); at an SNR like
    the runs' (0.02) and K = 8 its standard error is within [1, 1.6] × the true spread."""
    rng = np.random.default_rng(2)
    p, k, reps = 30, 8, 600
    mu = np.full(p, 0.15)
    est = [noise_scale(mu + rng.normal(size=(k, p))) for _ in range(reps)]
    for value, se in (("signal", "signal_se"), ("noise", "noise_se"), ("snr", "snr_se")):
        spread = np.std([getattr(e, value) for e in est], ddof=1)
        mean_se = np.mean([getattr(e, se) for e in est])
        assert 0.95 < mean_se / spread < 1.6, (value, mean_se, spread)
    assert np.isnan(noise_scale(rng.normal(size=(2, p))).snr_se)  # K = 2 has no jackknife


def test_identical_draws_are_all_signal_and_a_nonpositive_signal_needs_an_infinite_batch():
    g = np.tile(np.arange(1.0, 4.0), (3, 1))
    est = noise_scale(g)
    assert (est.noise, est.signal, est.mean_cosine) == pytest.approx((0.0, 14.0, 1.0))
    assert est.snr == float("inf") and np.isnan(est.snr_se)
    opposite = noise_scale(np.array([[1.0, 0.0], [-1.0, 0.0]]))
    assert opposite.signal < 0 and opposite.batch_for_snr_one(8) == float("inf")
    with pytest.raises(ValueError, match="K ≥ 2"):
        noise_scale(np.ones((1, 3)))


def test_a_draw_is_the_unclipped_gradient_of_that_step_and_leaves_the_state_alone():
    torch.set_num_threads(1)
    over = {"train.batch_size": 2, "train.rollouts_theta": 1, "train.rollouts_rho": 1}
    cfg = load_config(None, overrides={**over, "train.grad_clip": UNCLIPPED})
    clipped = load_config(None, overrides={**over, "train.grad_clip": 1e-6})
    state = init_state(cfg)
    world = build_world(cfg)
    g1, n1 = step_gradient(cfg, state, world, 1)
    again, _ = step_gradient(cfg, state, world, 1)  # the same state: the same draw
    g2, _ = step_gradient(cfg, state, world, 2)
    tiny, _ = step_gradient(clipped, state, world, 1)
    assert n1 == 4 and g1.shape == g2.shape and np.linalg.norm(g1) > 0
    v = lora_vector(cfg, state, world)  # the parameters, in the gradient's order
    assert v.shape == g1.shape and np.count_nonzero(v) == v.size // 2  # LoRA B starts at zero
    np.testing.assert_array_equal(g1, again)
    assert not np.array_equal(g1, g2)
    # clipping (to the joint norm of LoRA and heads) would have shrunk it: the draw has none
    assert np.linalg.norm(tiny) < 1e-5 < np.linalg.norm(g1)


def test_drift_cosines_by_hand():
    dr = drift_cosines(np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([3.0, 3.0]))
    # Ḡ = (0.5, 1) against d ∝ (1, 1): (0.5 + 1) / (√1.25 · √2); each draw at 45°
    assert dr.cosine == pytest.approx(1.5 / np.sqrt(1.25 * 2))
    assert (dr.per_draw, dr.per_draw_se) == pytest.approx((np.sqrt(0.5), 0.0))
    assert (dr.norm, dr.rms) == pytest.approx((np.sqrt(18), 3.0))
