"""The closing comparison of a run: paired differences over held-out records, checked against a
computation written here."""

import math

import numpy as np
import pandas as pd
import pytest

from evosteer_core.evaluation.heldout_summary import paired


def _table(rewards: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"record_id": rid, "run": k, "reward": r}
            for rid, runs in rewards.items()
            for k, r in enumerate(runs)
        ]
    )


def test_paired_difference_is_over_records_means_with_their_sd():
    rng = np.random.default_rng(3)
    ids = [f"r{i}" for i in range(7)]
    a = {rid: list(rng.random(3)) for rid in ids}
    b = {rid: list(rng.random(3)) for rid in ids}
    d = [np.mean(a[rid]) - np.mean(b[rid]) for rid in ids]
    got = paired(_table(a), _table(b).sample(frac=1.0, random_state=0))  # order does not matter
    assert got.diff == pytest.approx(np.mean(d))
    assert got.se == pytest.approx(np.std(d, ddof=1) / math.sqrt(len(d)))


def test_rows_on_different_records_are_refused():
    with pytest.raises(ValueError, match="same records"):
        paired(_table({"a": [1.0]}), _table({"b": [1.0]}))


def test_one_record_has_no_standard_error():
    assert math.isnan(paired(_table({"a": [1.0]}), _table({"a": [0.0]})).se)
