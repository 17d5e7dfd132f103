"""The training step: batch sampling, rollouts, pairs, statistics, update and determinism."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
import torch

from evosteer_core.episode.records import FAMILIES
from evosteer_core.infra.config import load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.sim.skills import LATENT_SKILLS
from evosteer_core.skills.admission import SkillState
from evosteer_core.skills.skill import Skill
from evosteer_core.training.loop import train
from evosteer_core.training.session import init_state, open_session
from evosteer_core.training.stages import (
    reference_states,
    rescore_stage,
    rollout_stage,
    sample_batch,
)
from evosteer_core.training.update import update_stage

SMALL = {
    "train.batch_size": 6,
    "train.rollouts_theta": 1,
    "train.rollouts_rho": 1,
    "budget.max_actions": 8,
    "sim.n_train_per_family": 4,
    "sim.n_heldout_per_family": 2,
    "skills.warmup_steps": 1,
}


@pytest.fixture(scope="module")
def cfg():
    torch.set_num_threads(1)
    return load_config(None, overrides=SMALL)


def test_sample_batch_is_source_balanced_without_replacement(cfg):
    s = open_session(cfg, init_state(cfg))
    records = s.world.train_records
    for step in range(1, 7):
        batch = sample_batch(records, 8, run_seed=1, step=step)
        counts = pd.Series([r.family for r in batch]).value_counts()
        assert set(counts.index) == set(FAMILIES)
        assert counts.min() == 1 and counts.max() == 2 and counts.sum() == 8
        assert len({r.record_id for r in batch}) == 8

    def doubled(step: int) -> tuple[str, ...]:
        counts = pd.Series([r.family for r in sample_batch(records, 8, 1, step)]).value_counts()
        return tuple(sorted(counts[counts == 2].index))

    assert len({doubled(k) for k in range(6)}) == 3  # the two extra slots rotate over families
    with pytest.raises(ValueError, match="batch needs"):
        sample_batch(records, 6 * 5, 1, 1)


def _with_candidate(cfg, family: str):
    state = init_state(cfg)
    s = open_session(cfg, state)
    latent = next(x for x in LATENT_SKILLS)
    skill = Skill.from_dict({**latent, "family": family}, where="test")
    s.skills.library, rejection = s.skills.library.admit(skill, 1, [])
    assert rejection is None
    return s, skill.skill_id


def test_pairs_candidate_selectable_in_treatment_never_seen_by_control(cfg):
    s, sid = _with_candidate(cfg, "aime")
    rollouts = rollout_stage(s, step=3)
    trajectories, decisions = rollouts.trajectories, rollouts.decisions
    arms = trajectories.set_index("traj_id")["arm"]
    treat = trajectories[trajectories["arm"] == "pair_treat"]
    assert len(treat) == 1 and (treat["pair_skill"] == sid).all()
    d_arm = decisions["traj_id"].map(arms)
    first_treat = decisions[(d_arm == "pair_treat") & (decisions["t"] == 0)].iloc[0]
    assert sid in first_treat["action"] and first_treat["forced"]
    first_control = decisions[(d_arm == "pair_control") & (decisions["t"] == 0)].iloc[0]
    assert first_control["action"] == '{"kind":"ADD_AGENT","node_id":"n0","role_id":"solver"}'
    control_legal = decisions[d_arm == "pair_control"]["legal"]
    assert not any(sid in a for legal in control_legal for a in legal)
    # the candidate is in the menu of natural rollouts of its family while under test
    natural_aime = decisions[(d_arm == "theta") & decisions["traj_id"].str.contains("aime")]
    assert any(sid in a for legal in natural_aime["legal"] for a in legal)


def test_pairs_enter_buckets_but_not_shrinkage_pool(cfg):
    s, _ = _with_candidate(cfg, "aime")
    state = init_state(cfg)
    rollouts = rollout_stage(s, step=3)
    trajectories, decisions = rollouts.trajectories, rollouts.decisions
    rescored = rescore_stage(s, decisions)
    out = update_stage(s, rollouts, rescored, state.actor_optimizer)
    rho = trajectories[(trajectories["arm"] == "rho") & trajectories["healthy"]]
    n_g, _, _ = s.pool.counts("x", "aime")
    assert n_g == len(rho)  # natural reference rollouts only
    paired = trajectories[trajectories["arm"].str.startswith("pair")]
    eligible = pd.concat([rho, paired])
    d = decisions[decisions["traj_id"].isin(eligible["traj_id"])]
    visits = sum(b["n"] for b in _bucket_counts(out.buckets))
    assert visits == 2 * (len(d) + len(eligible))  # exact + coarse, states + terminals


def _bucket_counts(buckets: dict) -> list[dict]:
    rows = []
    for table in ("exact", "coarse"):
        for entry in buckets["committed"][table].values():
            rows.append({"n": entry[1] if isinstance(entry, list) else entry["n"]})
    return rows


def test_reference_states_exclude_theta_and_forced_prefix(cfg):
    s, _ = _with_candidate(cfg, "aime")
    rollouts = rollout_stage(s, step=3)
    trajectories, decisions = rollouts.trajectories, rollouts.decisions
    ref = reference_states(trajectories, decisions)
    arm = decisions["traj_id"].map(trajectories.set_index("traj_id")["arm"])
    n_rho = int((arm == "rho").sum())
    n_pair = int((arm.str.startswith("pair") & (decisions["t"] > 0)).sum())
    n_term = int((trajectories["arm"] != "theta").sum())
    assert len(ref["features"]) == n_rho + n_pair + n_term


def _digest(state) -> str:
    return hashlib.sha256(state.to_bytes()).hexdigest()


def test_two_runs_with_the_same_seed_are_bitwise_identical(cfg):
    a, hist_a = train(cfg, steps=2)
    b, hist_b = train(cfg, steps=2)
    assert _digest(a) == _digest(b)
    assert pd.DataFrame(hist_a).equals(pd.DataFrame(hist_b))
    assert any(not torch.equal(v, torch.zeros_like(v)) for v in a.adapter.values())


def test_skill_state_round_trips(cfg):
    s, _ = _with_candidate(cfg, "medqa")
    again = SkillState.from_dict(s.skills.to_dict(), cfg.skills)
    assert again.to_dict() == s.skills.to_dict()


def test_two_pass_actor_gradient_equals_direct_autograd():
    """Σ_t Γ_t ∇ℓ_θ (micro-batched, ``train.update_micro_batch`` decisions a pass) equals
    autograd through the loss with Δℓ = ℓ_θ − ℓ_ρ."""
    from evosteer_core.objectives import build_objective
    from evosteer_core.training.update import ScoredBatch

    cfg = load_config(None, overrides={**SMALL, "train.update_micro_batch": 5})
    state = init_state(cfg)
    s = open_session(cfg, state)
    with torch.no_grad():  # a non-zero adapter, so that θ ≠ ρ
        for p in s.policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    rollouts = rollout_stage(s, step=1)
    trajectories, decisions = rollouts.trajectories, rollouts.decisions
    rescored = rescore_stage(s, decisions).table
    scored = trajectories.set_index("traj_id")
    u = {t: 0.7 for t in scored.index}
    objective = build_objective("anchortb", beta=2.0)
    params = s.policy.trainable_parameters()

    built = ScoredBatch(s, scored, decisions, rescored, u)
    objective(built.batch()).loss.backward()
    passes, score = [], s.policy.score

    def counted(prompts, *args, **kwargs):
        passes.append(len(prompts))
        return score(prompts, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(s.policy, "score", counted)
        built.backprop_actor()
    multi = int((built.rows["legal"].map(len) > 1).sum())
    assert passes == [5] * (multi // 5) + ([multi % 5] if multi % 5 else []) and multi > 5
    two_pass = [p.grad.clone() for p in params]

    for p in params:
        p.grad = None
    rows = built.rows
    theta = s.policy.score(
        rows["prompt"].tolist(),
        rows["action"].tolist(),
        rows["legal"].tolist(),
        use_adapter=True,
        requires_grad=True,
    )
    direct = ScoredBatch(s, scored, decisions, rescored, u).batch()
    delta = theta - torch.tensor(rows["logp_rho"].to_numpy(), dtype=torch.float32)
    pos = {tid: i for i, tid in enumerate(scored.index)}
    r = torch.tensor(rows["traj_id"].map(pos).to_numpy())
    c = torch.tensor(rows["t"].to_numpy())
    direct.delta_logp = torch.zeros_like(direct.delta_logp).index_put((r, c), delta)
    objective(direct).loss.backward()
    for a, b in zip(two_pass, (p.grad for p in params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in two_pass)


@pytest.mark.parametrize("value", [0, -8])
def test_a_non_positive_update_micro_batch_is_one_line_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"train.*update_micro_batch: must be > 0 or null"):
        load_config(None, overrides={"train.update_micro_batch": value})
    assert load_config(None, overrides={"train.update_micro_batch": None}).train == (
        load_config(None).train
    )


def test_evaluation_of_theta_and_rho_is_paired(cfg):
    """θ and ρ evaluation episodes share every seed: at initialization (θ = ρ) they coincide."""
    from evosteer_core.evaluation.rollouts import evaluate_policy

    s = open_session(cfg, init_state(cfg))
    records = s.world.heldout_records[:6]
    assert evaluate_policy(s, records, True) == evaluate_policy(s, records, False)


def test_sharded_rollouts_concatenate_to_the_unsharded_tables(cfg):
    s = open_session(cfg, init_state(cfg))
    whole = rollout_stage(s, step=2)
    whole_t, whole_d = whole.trajectories, whole.decisions
    parts = [rollout_stage(s, step=2, shard=k, n_shards=3) for k in range(3)]
    t = pd.concat([p.trajectories for p in parts]).set_index("traj_id").sort_index()
    d = pd.concat([p.decisions for p in parts]).sort_values(["traj_id", "t"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(t, whole_t.set_index("traj_id").sort_index())
    # floats agree to float32 rounding (a shard's batches have other shapes); h_ρ lists too
    pd.testing.assert_frame_equal(d.drop(columns="h_rho"), whole_d.drop(columns="h_rho"))
    assert (d["h_rho"].map(len) == whole_d["h_rho"].map(len)).all()
    for got, want in zip(d["h_rho"], whole_d["h_rho"], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="shard 3"):
        rollout_stage(s, step=2, shard=3, n_shards=3)


def test_rescore_reuses_the_sampling_pass_and_matches_a_full_rescore(cfg, monkeypatch):
    """ℓ of each sampled action under its own policy, and h_ρ of each ρ-sampled prompt, come
    from the rollout; the re-score runs only the other policy on those rows (and both on
    forced rows, paired arms' first actions included). Every value equals scoring every row
    under both policies from scratch, to float32 rounding."""
    s, _ = _with_candidate(cfg, "aime")  # paired arms: forced first actions with a choice
    decisions = rollout_stage(s, step=3).decisions
    by = decisions["sampled_by"]
    assert set(by) == {"theta", "rho", ""}
    assert (decisions.loc[by == "rho", "h_rho"].map(len) > 0).all()
    scored: dict[str, int] = {"theta": 0, "rho": 0}
    score, encode = s.policy.score, s.policy.score_and_encode_rho

    def counting_score(prompts, *args, **kwargs):
        scored["theta"] += len(prompts)
        return score(prompts, *args, **kwargs)

    def counting_encode(prompts, *args, **kwargs):
        scored["rho"] += len(prompts)
        return encode(prompts, *args, **kwargs)

    monkeypatch.setattr(s.policy, "score", counting_score)
    monkeypatch.setattr(s.policy, "score_and_encode_rho", counting_encode)
    table = rescore_stage(s, decisions).table
    assert scored == {"theta": int((by != "theta").sum()), "rho": int((by != "rho").sum())}
    monkeypatch.undo()
    args = decisions["prompt"].tolist(), decisions["action"].tolist(), decisions["legal"].tolist()
    with torch.no_grad():
        theta = s.policy.score(*args, use_adapter=True).double().numpy()
        rho, h = s.policy.score_and_encode_rho(*args)
    np.testing.assert_allclose(table["logp_theta"], theta, atol=1e-5)
    np.testing.assert_allclose(table["logp_rho"], rho.double().numpy(), atol=1e-5)
    np.testing.assert_allclose(np.array(table["h_rho"].tolist()), h.numpy(), atol=1e-5)
