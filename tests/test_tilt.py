"""The learned-tilt report (evosteer_core.tilt) against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from evosteer_core.tilt import auc, tilt_report


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
