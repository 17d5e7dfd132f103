"""Hierarchical shrinkage (B.3–B.4): a hand-computed pool, Lemma B.2 ranges, Prop. B.3 deletion."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evosteer_core.anchors import AnchorConfig, RecordPrior, ShrinkagePool
from evosteer_core.episode.records import FAMILIES

A_BETA = math.exp(2.0) - 1


def hand_pool() -> ShrinkagePool:
    pool = ShrinkagePool()
    for record, family, reward in [
        ("q1", "aime", 1.0),
        ("q1", "aime", 0.0),
        ("q1", "aime", 1.0),
        ("q2", "aime", 0.0),
        ("q3", "medqa", 1.0),
        ("q3", "medqa", 1.0),
    ]:
        pool.add(record, family, reward)
    return pool


def test_hand_computed_levels() -> None:
    pool = hand_pool()
    a = pool.anchor("q1", "aime")
    # m_g = 4/6; m_c = (2 + 2·2/3)/(4 + 2) = 5/9; m_0 = m_c; p̂ = (2 + 0.5·5/9)/(3 + 0.5) = 41/63
    assert a.m_g == pytest.approx(2 / 3)
    assert a.m_c == pytest.approx(5 / 9)
    assert a.m_0 == pytest.approx(5 / 9)
    assert a.p_hat == pytest.approx(41 / 63)
    assert a.u == pytest.approx(math.log(1 + A_BETA * 41 / 63))
    assert pool.counts("q1", "aime") == (6, 4, 3)


def test_leave_one_out_removes_only_the_task_sums() -> None:
    pool = hand_pool()
    # the scored trajectory is one of q1's pooled rollouts with reward 1: S_q = 1, N_q = 2
    loo_success = pool.anchor("q1", "aime", leave_out=1.0)
    assert loo_success.p_hat == pytest.approx((1 + 0.5 * 5 / 9) / 2.5)  # 23/45
    # ... with reward 0: S_q = 2, N_q = 2
    loo_failure = pool.anchor("q1", "aime", leave_out=0.0)
    assert loo_failure.p_hat == pytest.approx((2 + 0.5 * 5 / 9) / 2.5)  # 41/45
    # global and family levels keep the trajectory
    assert (loo_success.m_g, loo_success.m_c) == (pytest.approx(2 / 3), pytest.approx(5 / 9))
    # a trajectory outside the pool (θ rollout, paired arm) gets no subtraction
    assert pool.anchor("q1", "aime").p_hat == pytest.approx(41 / 63)


def test_record_prior_is_capped() -> None:
    pool = hand_pool()
    a = pool.anchor("q1", "aime", prior=RecordPrior(p=0.2, n=30))
    # n'_d = min(30, 20) = 20: m_0 = (20·0.2 + 4·5/9)/(20 + 4) = 7/27; p̂ = (2 + 0.5·7/27)/3.5
    assert a.m_0 == pytest.approx(7 / 27)
    assert a.p_hat == pytest.approx(115 / 189)
    assert pool.anchor("q1", "aime", prior=RecordPrior(p=0.2, n=20)) == a


def test_empty_levels_fall_back() -> None:
    empty = ShrinkagePool().anchor("x", "hotpotqa")
    assert (empty.m_g, empty.m_c, empty.m_0, empty.p_hat) == (0.5, 0.5, 0.5, 0.5)
    unseen = hand_pool().anchor("q9", "nq_open")  # empty family and record: shrinks to m_g
    assert unseen.m_c == pytest.approx(2 / 3) and unseen.p_hat == pytest.approx(2 / 3)


def test_bad_inputs_name_what_is_wrong() -> None:
    pool = hand_pool()
    with pytest.raises(ValueError, match=r"not a pooled reward"):
        pool.anchor("q9", "aime", leave_out=1.0)
    with pytest.raises(ValueError, match=r"not a pooled reward"):
        pool.anchor("q3", "medqa", leave_out=0.0)  # q3 has only successes: S_q − 0 > N_q − 1
    with pytest.raises(ValueError, match=r"differs from its pooled family 'aime'"):
        pool.add("q1", "medqa", 1.0)
    with pytest.raises(ValueError, match=r"family 'chess'"):
        pool.add("q7", "chess", 1.0)
    with pytest.raises(ValueError, match=r"reward of record 'q1'"):
        pool.add("q1", "aime", 1.5)
    with pytest.raises(ValueError, match="RecordPrior.p"):
        RecordPrior(p=-0.1, n=3)
    with pytest.raises(ValueError, match="AnchorConfig.kappa_q"):
        AnchorConfig(kappa_q=0.0)


pools = st.lists(
    st.tuples(st.integers(0, 7), st.sampled_from(FAMILIES), st.floats(0.0, 1.0)),
    min_size=1,
    max_size=40,
)


def build(
    entries: list[tuple[int, str, float]],
) -> tuple[ShrinkagePool, dict[str, list[float]], dict[str, str]]:
    """A pool from (record number, family, reward); a record keeps its first family."""
    pool = ShrinkagePool()
    by_record: dict[str, list[float]] = {}
    family_of: dict[str, str] = {}
    for rec, family, reward in entries:
        record = f"r{rec}"
        family = family_of.setdefault(record, family)
        pool.add(record, family, reward)
        by_record.setdefault(record, []).append(reward)
    return pool, by_record, family_of


@settings(max_examples=60, deadline=None)
@given(entries=pools, prior_p=st.floats(0.0, 1.0), prior_n=st.floats(0.0, 50.0))
def test_lemma_b2_ranges(entries, prior_p: float, prior_n: float) -> None:
    pool, by_record, family_of = build(entries)
    beta = pool.config.beta
    for record, rewards in by_record.items():
        for prior in (None, RecordPrior(prior_p, prior_n)):
            for leave_out in (None, rewards[0]):
                a = pool.anchor(record, family_of[record], leave_out=leave_out, prior=prior)
                for value in (a.m_g, a.m_c, a.m_0, a.p_hat):
                    assert 0.0 <= value <= 1.0
                assert 0.0 <= a.u <= beta + 1e-12


@settings(max_examples=60, deadline=None)
@given(entries=pools)
def test_prop_b3_deletion_identity(entries) -> None:
    """p̂ − p̂_{−i} = (Y_i − p̂_{−i}) / (n + κ_q) with the prior m_0 held fixed."""
    pool, by_record, family_of = build(entries)
    kappa_q = pool.config.kappa_q
    for record, rewards in by_record.items():
        full = pool.anchor(record, family_of[record]).p_hat
        for y in set(rewards):
            loo = pool.anchor(record, family_of[record], leave_out=y).p_hat
            assert full - loo == pytest.approx((y - loo) / (len(rewards) + kappa_q), abs=1e-12)
            assert abs(full - loo) <= 1 / (len(rewards) + kappa_q) + 1e-12


def test_state_round_trip_is_deterministic() -> None:
    pool = hand_pool()
    state = pool.to_dict()
    assert state["version"] == 1
    text = json.dumps(state, sort_keys=True)
    restored = ShrinkagePool.from_dict(json.loads(text))
    assert json.dumps(restored.to_dict(), sort_keys=True) == text
    assert restored.anchor("q1", "aime", leave_out=1.0) == pool.anchor("q1", "aime", leave_out=1.0)
    with pytest.raises(ValueError, match="version 0"):
        ShrinkagePool.from_dict({**state, "version": 0})
