"""The stages of one training step (docs/method.md §1.9, paper Alg. 1), each with a typed result.

``rollout_stage`` → ``rescore_stage`` → ``value_stage`` → ``update_stage``
(:mod:`evosteer_core.training.update`) → ``validation_stage`` → ``checkpoint_stage``. A stage is
deterministic given the session it runs on, its inputs and the run seed; it may update the
session's live objects (the value head is fitted, the validation round advances the skill
state), and everything the next step needs is in its result. Each result's ``artifacts()`` is
what the pipeline stores (:mod:`evosteer_core.pipeline.stage_io`); the result types are in
:mod:`evosteer_core.training.results`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from evosteer_core.episode.budget import TokenUsage
from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.rollout import FAMILY_INDEX, EpisodePlan, run_rollouts
from evosteer_core.infra.schemas import validate_rescored
from evosteer_core.infra.seeding import numpy_rng
from evosteer_core.training.heads import HeadFitConfig, fit_outcome_heads, fit_value_head
from evosteer_core.training.results import ActorUpdate, Rescored, Rollouts, Validation, ValueFit
from evosteer_core.training.session import Session, cpu_state, rng_state
from evosteer_core.training.state import TrainState


# --- stage 1: rollouts ---------------------------------------------------------------------
def sample_batch(
    records: list[TaskRecord], batch_size: int, run_seed: int, step: int
) -> list[TaskRecord]:
    """Source-balanced batch without replacement: ⌊B/6⌋ per family plus a rotating remainder."""
    by_family = {f: [r for r in records if r.family == f] for f in FAMILIES}
    by_family = {f: rs for f, rs in by_family.items() if rs}
    fams = sorted(by_family, key=FAMILIES.index)
    base, rem = divmod(batch_size, len(fams))
    counts = {f: base for f in fams}
    for j in range(rem):
        counts[fams[(step * rem + j) % len(fams)]] += 1
    batch: list[TaskRecord] = []
    for f in fams:
        pool = by_family[f]
        if counts[f] > len(pool):
            raise ValueError(f"family {f!r} has {len(pool)} records; batch needs {counts[f]}")
        order = numpy_rng(run_seed, step, f, "batch").permutation(len(pool))[: counts[f]]
        batch += [pool[i] for i in sorted(order)]
    return batch


def rollout_plans(s: Session, batch: list[TaskRecord], step: int) -> list[EpisodePlan]:
    """2θ + 2ρ natural rollouts per record plus the paired arms the skill state asks for."""
    t = s.cfg.train
    plans = [EpisodePlan(r, "theta", k) for r in batch for k in range(t.rollouts_theta)]
    plans += [EpisodePlan(r, "rho", k) for r in batch for k in range(t.rollouts_rho)]
    for k, pair in enumerate(s.skills.pair_plans(batch, step)):
        rec = next(r for r in batch if r.record_id == pair.record_id)
        for arm in ("pair_treat", "pair_control"):
            plans.append(EpisodePlan(rec, arm, k, pair_skill=pair.skill_id, pair_kind=pair.kind))
    return plans


def rollout_stage(s: Session, step: int, shard: int = 0, n_shards: int = 1) -> Rollouts:
    """Stage 1: collect the step's trajectories with the v̂ snapshot and menus frozen.

    With ``n_shards`` > 1 only the plans ``shard::n_shards`` run (the cluster's map_task
    fan-out); every draw is keyed per episode, so the shards' tables together equal one run.
    """
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is not in 0..{n_shards - 1}")
    batch = sample_batch(s.world.train_records, s.cfg.train.batch_size, s.cfg.train.seed, step)
    plans = rollout_plans(s, batch, step)[shard::n_shards]
    ctx = s.rollout_context(s.cfg.train.seed, step, evaluation=False)
    done = run_rollouts(s.policy, plans, ctx)
    usage = TokenUsage()
    for ep in done.episodes:  # what the episodes used, for the run's cost record
        usage.add(ep.ledger.usage)
    return Rollouts(done.trajectories, done.decisions, usage)


# --- stage 2: re-scoring ---------------------------------------------------------------------
def rescore_stage(s: Session, decisions: pd.DataFrame) -> Rescored:
    """Stage 2: ℓ_θ and ℓ_ρ of every recorded action (same prompt, tokens, mask) and h_ρ.

    The rollout already holds ℓ of each sampled action under the policy that sampled it
    (``logp_sample``) and h_ρ of each ρ-sampled prompt, from the same parameters, prompt,
    tokens and mask (docs/performance.md): only the other policy is run here, θ on the rows ρ
    sampled or that were forced, ρ (with h_ρ) on the rows θ sampled or that were forced.
    """
    by = decisions["sampled_by"].to_numpy()
    logp_theta = np.where(by == "theta", decisions["logp_sample"].to_numpy(float), 0.0)
    logp_rho = np.where(by == "rho", decisions["logp_sample"].to_numpy(float), 0.0)
    h_rho = list(decisions["h_rho"])
    with torch.no_grad():
        run = np.flatnonzero(by != "theta")
        if len(run):
            sub = decisions.iloc[run]
            lt = s.policy.score(
                sub["prompt"].tolist(), sub["action"].tolist(), sub["legal"].tolist(), True
            )
            logp_theta[run] = lt.double().cpu().numpy()
        run = np.flatnonzero(by != "rho")
        if len(run):
            sub = decisions.iloc[run]
            lr, h = s.policy.score_and_encode_rho(
                sub["prompt"].tolist(), sub["action"].tolist(), sub["legal"].tolist()
            )
            logp_rho[run] = lr.double().cpu().numpy()
            for k, row in zip(run, h.float().cpu(), strict=True):
                h_rho[k] = row.tolist()
    rescored = pd.DataFrame(
        {
            "traj_id": decisions["traj_id"],
            "t": decisions["t"],
            "logp_theta": logp_theta,
            "logp_rho": logp_rho,
            "h_rho": [list(map(float, h)) for h in h_rho],
        }
    )
    validate_rescored(decisions, rescored)
    return Rescored(rescored)


# --- stage 3: value head ---------------------------------------------------------------------
def reference_states(trajectories: pd.DataFrame, decisions: pd.DataFrame) -> dict[str, list]:
    """Legal reference states with their terminal rewards: natural ρ rollouts (all states) and
    paired arms without their forced prefix (docs/method.md §1.5); unhealthy trajectories are
    left out."""
    ok = trajectories[trajectories["complete"] & trajectories["healthy"]]
    ref = ok[ok["arm"].isin(["rho", "pair_treat", "pair_control"])].set_index("traj_id")
    d = decisions[decisions["traj_id"].isin(ref.index)]
    d = d[~(d["traj_id"].map(ref["arm"]).str.startswith("pair") & (d["t"] == 0))]
    feats = d["features"].tolist() + ref["terminal_features"].tolist()
    fams = d["traj_id"].map(ref["family"]).tolist() + ref["family"].tolist()
    rewards = d["traj_id"].map(ref["reward"]).tolist() + ref["reward"].tolist()
    return {"features": feats, "family": fams, "reward": rewards}


def value_stage(
    s: Session, rollouts: Rollouts, rescored: Rescored, window: list[dict[str, list]]
) -> ValueFit:
    """Stage 3: fit v̂ on the replay window (this step + previous ones) and the outcome heads."""
    cfg = s.cfg.train
    trajectories, decisions = rollouts.trajectories, rollouts.decisions
    now = reference_states(trajectories, decisions)
    new_window = ([*window, now])[-cfg.value_window :]
    feats = torch.tensor([f for w in new_window for f in w["features"]], dtype=torch.float32)
    fam = torch.tensor([FAMILY_INDEX[x] for w in new_window for x in w["family"]])
    y = torch.tensor([r for w in new_window for r in w["reward"]], dtype=torch.float32)
    hcfg = HeadFitConfig(
        steps=cfg.value_fit_steps,
        lr=cfg.heads.lr,
        betas=cfg.heads.betas,
        weight_decay=cfg.heads.weight_decay,
        grad_clip=cfg.grad_clip,
    )
    mse = fit_value_head(s.value_head, feats, fam, y, hcfg)
    rho = trajectories[(trajectories["arm"] == "rho") & trajectories["healthy"]].set_index(
        "traj_id"
    )
    m = rescored.table[rescored.table["traj_id"].isin(rho.index)]
    dec = decisions.loc[m.index]
    out = fit_outcome_heads(
        s.outcome_heads,
        torch.tensor(m["h_rho"].tolist(), dtype=torch.float32),
        torch.tensor(dec["features"].tolist(), dtype=torch.float32),
        torch.tensor(m["traj_id"].map(rho["reward"]).tolist(), dtype=torch.float32),
        hcfg,
    )
    metrics = {"value_mse": mse, "outcome_bce": out["bce"], "outcome_mse": out["mse"]}
    return ValueFit(
        value_head=cpu_state(s.value_head.state_dict()),
        outcome_heads=cpu_state(s.outcome_heads.state_dict()),
        window=new_window,
        metrics=metrics,
    )


# --- stage 5: validation round ---------------------------------------------------------------
def validation_stage(s: Session, rollouts: Rollouts, step: int) -> Validation:
    """Stage 5: paired W/L/T, the author window and the sequential tests (docs/method.md §1.8)."""
    prompts = {r.record_id: r.prompt for r in s.world.train_records}
    metrics = s.skills.validation_round(
        rollouts.trajectories, rollouts.decisions, prompts, step, s.world.executor, s.cfg.train.seed
    )
    return Validation(skills=s.skills.to_dict(), metrics=metrics)


# --- stage 6: checkpoint ---------------------------------------------------------------------
def checkpoint_stage(
    state: TrainState,
    step: int,
    value: ValueFit,
    update: ActorUpdate,
    validation: Validation,
    *,
    seed: int,
) -> TrainState:
    """Stage 6: the next state (adapter, heads, optimizer, statistics, skills, RNG) from the
    results of stages 3–5 (``state``, the previous one, is where the next step starts from)."""
    return TrainState(
        step=step,
        adapter=update.adapter,
        flow_head=update.flow_head,
        value_head=value.value_head,
        outcome_heads=value.outcome_heads,
        actor_optimizer=update.actor_optimizer,
        pool=update.pool,
        buckets=update.buckets,
        value_window=value.window,
        skills=validation.skills,
        rng_state=rng_state(seed, step),
        nonfinite_steps=update.nonfinite_steps,
        objective=update.objective,
    )
