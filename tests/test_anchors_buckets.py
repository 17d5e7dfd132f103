"""Structural buckets (Eq. 9, B.10–B.11): hand values, fallback, one-step lag, bounds, state."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evosteer_core.anchors import AnchorConfig, StateKeys, StructuralBuckets, visit_ratio_excess

BETA = 2.0
S1 = StateKeys(exact="g:abc|n2|e1|open", coarse="n2|e1|open")
S1_TWIN = StateKeys(exact="g:xyz|n2|e1|open", coarse="n2|e1|open")  # same coarse bucket


def test_visit_ratio_excess() -> None:
    assert visit_ratio_excess(BETA, 1.0) == pytest.approx(math.e**BETA / math.e - 1)
    assert visit_ratio_excess(0.5, 0.5) == 0.0


def test_empty_and_unread_buckets_give_zero() -> None:
    buckets = StructuralBuckets()
    assert buckets.correction(S1) == 0.0
    buckets.add_trajectory([S1] * 20, log_reward=BETA, u=0.5)
    assert buckets.correction(S1) == 0.0  # pending visits are not read during this step
    buckets.commit()
    assert buckets.correction(S1) != 0.0


def test_hand_computed_correction_and_clip() -> None:
    buckets = StructuralBuckets()
    # 8 visits, each y = e^{0.1} − 1: A = 1 + 8y/16, c = log A (inside the clip)
    buckets.add_trajectory([S1] * 8, log_reward=0.6, u=0.5)
    buckets.commit()
    y = math.expm1(0.1)
    assert buckets.correction(S1) == pytest.approx(math.log(1 + 8 * y / 16))
    # a second step of big failures pushes log A below −c_max
    buckets.add_trajectory([S1] * 8, log_reward=0.0, u=BETA)
    buckets.commit()
    assert buckets.correction(S1) == -0.25


def test_exact_then_coarse_then_zero() -> None:
    buckets = StructuralBuckets()
    buckets.add_trajectory([S1] * 7, log_reward=0.7, u=0.5)
    buckets.add_trajectory([S1_TWIN] * 3, log_reward=0.3, u=0.5)
    buckets.commit()
    assert buckets.visits(S1) == (7, 10)
    # exact has 7 < 8 visits: read the coarse bucket (10 visits, Σy over both structures)
    sum_y = 7 * math.expm1(0.2) + 3 * math.expm1(-0.2)
    assert buckets.correction(S1) == pytest.approx(math.log(1 + sum_y / (10 + 8)))
    buckets.add_trajectory([S1], log_reward=0.7, u=0.5)  # multiplicity: one more visit
    buckets.commit()
    assert buckets.correction(S1) == pytest.approx(math.log(1 + 8 * math.expm1(0.2) / 16))
    lonely = StateKeys(exact="g:q|n1|e0|open", coarse="n1|e0|open")
    buckets.add_trajectory([lonely] * 7, log_reward=BETA, u=0.0)
    buckets.commit()
    assert buckets.correction(lonely) == 0.0  # fewer than 8 visits at both levels


def test_min_visits_is_configurable() -> None:
    buckets = StructuralBuckets(AnchorConfig(min_visits=2))
    buckets.add_trajectory([S1, S1], log_reward=0.7, u=0.5)
    buckets.commit()
    assert buckets.correction(S1) == pytest.approx(math.log(1 + 2 * math.expm1(0.2) / 10))


visits = st.lists(
    st.tuples(st.integers(0, 3), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(1, 12)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(entries=visits, c_max=st.sampled_from([0.25, 1.0, 100.0]))
def test_lemma_b6_bounds(entries, c_max: float) -> None:
    """R_β, e^u in [1, e^β] ⇒ A_g in [e^−β, e^β] and |c| ≤ min(β, c_max)."""
    config = AnchorConfig(c_max=c_max, min_visits=1)
    buckets = StructuralBuckets(config)
    keys = [StateKeys(exact=f"g{k}", coarse=f"c{k % 2}") for k in range(4)]
    for k, reward, p_hat, repeat in entries:
        buckets.add_trajectory(
            [keys[k]] * repeat, log_reward=config.log_reward(reward), u=config.measured_flow(p_hat)
        )
    buckets.commit()
    for key in keys:
        assert abs(buckets.correction(key)) <= min(BETA, c_max) + 1e-12


def test_state_round_trip_keeps_pending() -> None:
    buckets = StructuralBuckets()
    buckets.add_trajectory([S1] * 9, log_reward=0.9, u=0.5)
    buckets.commit()
    buckets.add_trajectory([S1_TWIN] * 9, log_reward=0.1, u=0.5)
    state = buckets.to_dict()
    assert state["version"] == 1
    text = json.dumps(state, sort_keys=True)
    restored = StructuralBuckets.from_dict(json.loads(text))
    assert json.dumps(restored.to_dict(), sort_keys=True) == text
    assert restored.correction(S1) == buckets.correction(S1)
    restored.commit()
    buckets.commit()
    assert restored.correction(S1_TWIN) == buckets.correction(S1_TWIN) != 0.0
    with pytest.raises(ValueError, match="version 2"):
        StructuralBuckets.from_dict({**state, "version": 2})


def test_keys_must_be_strings() -> None:
    with pytest.raises(TypeError, match="StateKeys.exact"):
        StateKeys(exact=("n", 2), coarse="n2")  # type: ignore[arg-type]
