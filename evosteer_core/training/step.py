"""The pure step functions of one training step (docs/method.md §1.9, Alg. 1) and the plain train loop.

Each stage is deterministic given its inputs and the run seed; the Flyte tasks in ``evosteer_flyte/tasks/``
wrap exactly these functions. Stages: ``rollout_stage`` → ``rescore_stage`` →
``value_stage`` → ``update_stage`` → ``validation_stage`` → ``checkpoint_stage``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from evosteer_core.anchors import AnchorConfig, ShrinkagePool, StateKeys, StructuralBuckets
from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.rollout import (
    FAMILY_INDEX,
    EpisodePlan,
    RolloutContext,
    collect_rollouts,
)
from evosteer_core.episode.world import World, build_world
from evosteer_core.evaluation.tilt import auc
from evosteer_core.executors.base import Executor
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.schemas import validate_rescored
from evosteer_core.infra.seeding import derive_seed, numpy_rng, torch_generator
from evosteer_core.objectives import TrajectoryBatch, build_objective
from evosteer_core.policy.orchestrator import Orchestrator, build_orchestrator
from evosteer_core.sim.executor import SimExecutor
from evosteer_core.skills.admission import SkillState
from evosteer_core.training.heads import (
    FlowCorrection,
    HeadFitConfig,
    OutcomeHeads,
    ValueHead,
    fit_outcome_heads,
    fit_value_head,
)
from evosteer_core.training.state import TrainState

_log = logging.getLogger(__name__)


def _anchor_config(cfg: RunConfig) -> AnchorConfig:
    a = cfg.anchors
    kg, kc, kq = a.kappa
    return AnchorConfig(
        beta=cfg.train.beta,
        kappa_g=kg,
        kappa_c=kc,
        kappa_q=kq,
        prior_cap=a.record_prior_cap,
        n0=a.n0,
        c_max=a.c_max,
        min_visits=a.min_visits,
    )


def _actor_optimizer(cfg: RunConfig, policy: Orchestrator, flow: FlowCorrection):
    """AdamW with two parameter groups clipped together: LoRA (actor lr) and b_ψ (heads lr)."""
    t = cfg.train
    return torch.optim.AdamW(
        [
            {"params": policy.trainable_parameters(), "lr": t.actor.lr, "betas": t.actor.betas},
            {"params": list(flow.parameters()), "lr": t.heads.lr, "betas": t.heads.betas},
        ],
        weight_decay=t.actor.weight_decay,
    )


@dataclass
class Session:
    """Objects rebuilt from a config and a state: the policy, heads, world and statistics."""

    cfg: RunConfig
    world: World
    policy: Orchestrator
    value_head: ValueHead
    flow_head: FlowCorrection
    outcome_heads: OutcomeHeads
    pool: ShrinkagePool
    buckets: StructuralBuckets
    skills: SkillState


def open_session(cfg: RunConfig, state: TrainState, world: World | None = None) -> Session:
    """Rebuild live objects from ``state`` (cheap: the tiny backbone loads in well under 1 s)."""
    seed = cfg.train.seed
    policy = build_orchestrator(cfg)
    policy.load_adapter_state(state.adapter)
    value = ValueHead(seed=derive_seed(seed, "value_head"))
    value.load_state_dict(state.value_head)
    value.eval()
    flow = FlowCorrection(policy.hidden_size, seed=derive_seed(seed, "flow_head"))
    flow.load_state_dict(state.flow_head)
    outcome = OutcomeHeads(policy.hidden_size, seed=derive_seed(seed, "outcome_heads"))
    outcome.load_state_dict(state.outcome_heads)
    acfg = _anchor_config(cfg)
    pool = ShrinkagePool.from_dict(state.pool) if state.pool else ShrinkagePool(acfg)
    buckets = (
        StructuralBuckets.from_dict(state.buckets) if state.buckets else StructuralBuckets(acfg)
    )
    return Session(
        cfg=cfg,
        world=world or build_world(cfg),
        policy=policy,
        value_head=value,
        flow_head=flow,
        outcome_heads=outcome,
        pool=pool,
        buckets=buckets,
        skills=SkillState.from_dict(state.skills, cfg.skills),
    )


def init_state(cfg: RunConfig) -> TrainState:
    """Step-0 state: fresh adapter (LoRA B = 0, so θ = ρ), fresh heads, empty statistics."""
    seed = cfg.train.seed
    torch.manual_seed(derive_seed(seed, "torch_global"))
    policy = build_orchestrator(cfg)
    flow = FlowCorrection(policy.hidden_size, seed=derive_seed(seed, "flow_head"))
    opt = _actor_optimizer(cfg, policy, flow)
    acfg = _anchor_config(cfg)
    return TrainState(
        step=0,
        adapter=policy.adapter_state(),
        flow_head=_cpu(flow.state_dict()),
        value_head=_cpu(ValueHead(seed=derive_seed(seed, "value_head")).state_dict()),
        outcome_heads=_cpu(
            OutcomeHeads(policy.hidden_size, seed=derive_seed(seed, "outcome_heads")).state_dict()
        ),
        actor_optimizer=_cpu_tree(opt.state_dict()),
        pool=ShrinkagePool(acfg).to_dict(),
        buckets=StructuralBuckets(acfg).to_dict(),
        value_window=[],
        skills=SkillState.initial(cfg.skills).to_dict(),
        rng_state=_rng_state(cfg.train.seed, 0),
    )


def _rng_state(seed: int, step: int) -> torch.Tensor:
    """The RNG state a checkpoint records: derived from (run seed, step), so it does not depend
    on what else ran in the process (every draw of the loop uses its own derived generator)."""
    return torch_generator(seed, step, "torch_global").get_state()


def _cpu(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in sd.items()}


def _cpu_tree(obj: Any) -> Any:
    """Every tensor in a nested dict/list moved to the CPU (checkpoints are device-free)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _cpu_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_cpu_tree(v) for v in obj)
    return obj


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


def _rollout_context(
    s: Session, run_seed: int, step: int, menus: dict | None = None, *, evaluation: bool
) -> RolloutContext:
    """The frozen context of a rollout batch: menus, v̂ snapshot, budgets, renderer, and the
    reward: the official one for evaluation, the configured training reward otherwise."""
    return RolloutContext(
        catalogue=s.world.catalogue,
        limits=s.cfg.budget,
        executor=s.world.executor,
        evaluator=s.world.evaluator if evaluation else s.world.train_evaluator,
        menus=s.skills.menus() if menus is None else menus,
        value_head=s.value_head,
        run_seed=run_seed,
        step=step,
        renderer=s.cfg.policy.renderer,
        temperature=s.cfg.policy.temperature,
        decision_clock=_decision_clock(s.world.executor),
        max_consecutive_failures=s.cfg.executor.max_consecutive_failures,
        min_healthy_fraction=s.cfg.executor.min_healthy_fraction,
    )


def _decision_clock(executor: Executor) -> Callable[[int, int], float] | None:
    """The sim's simulated decision time (deterministic runs); None (measured) otherwise."""
    return executor.decision_seconds if isinstance(executor, SimExecutor) else None


def rollout_stage(
    s: Session, step: int, shard: int = 0, n_shards: int = 1
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage 1: collect the step's trajectories with the v̂ snapshot and menus frozen.

    With ``n_shards`` > 1 only the plans ``shard::n_shards`` run (the cluster's map_task
    fan-out); every draw is keyed per episode, so the shards' tables together equal one run.
    """
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is not in 0..{n_shards - 1}")
    batch = sample_batch(s.world.train_records, s.cfg.train.batch_size, s.cfg.train.seed, step)
    plans = rollout_plans(s, batch, step)[shard::n_shards]
    ctx = _rollout_context(s, s.cfg.train.seed, step, evaluation=False)
    return collect_rollouts(s.policy, plans, ctx)


# --- stage 2: re-scoring ---------------------------------------------------------------------
def rescore_stage(s: Session, decisions: pd.DataFrame) -> pd.DataFrame:
    """Stage 2: ℓ_θ and ℓ_ρ of every recorded action (same prompt, tokens, mask) and h_ρ."""
    prompts = decisions["prompt"].tolist()
    actions = decisions["action"].tolist()
    legal = decisions["legal"].tolist()
    with torch.no_grad():
        lt = s.policy.score(prompts, actions, legal, use_adapter=True)
        lr, h = s.policy.score_and_encode_rho(prompts, actions, legal)
    rescored = pd.DataFrame(
        {
            "traj_id": decisions["traj_id"],
            "t": decisions["t"],
            "logp_theta": lt.double().cpu().numpy(),
            "logp_rho": lr.double().cpu().numpy(),
            "h_rho": [row.tolist() for row in h.float().cpu()],
        }
    )
    validate_rescored(decisions, rescored)
    return rescored


# --- stage 3: value head ---------------------------------------------------------------------
def reference_states(trajectories: pd.DataFrame, decisions: pd.DataFrame) -> dict[str, list]:
    """Legal reference states with their terminal rewards: natural ρ rollouts (all states) and
    paired arms without their forced prefix (docs/method.md §1.5); unhealthy trajectories are left out."""
    ok = trajectories[trajectories["complete"] & trajectories["healthy"]]
    ref = ok[ok["arm"].isin(["rho", "pair_treat", "pair_control"])].set_index("traj_id")
    d = decisions[decisions["traj_id"].isin(ref.index)]
    d = d[~(d["traj_id"].map(ref["arm"]).str.startswith("pair") & (d["t"] == 0))]
    feats = d["features"].tolist() + ref["terminal_features"].tolist()
    fams = d["traj_id"].map(ref["family"]).tolist() + ref["family"].tolist()
    rewards = d["traj_id"].map(ref["reward"]).tolist() + ref["reward"].tolist()
    return {"features": feats, "family": fams, "reward": rewards}


def value_stage(
    s: Session,
    trajectories: pd.DataFrame,
    decisions: pd.DataFrame,
    rescored: pd.DataFrame,
    window: list[dict[str, list]],
) -> tuple[
    dict[str, torch.Tensor], dict[str, torch.Tensor], list[dict[str, list]], dict[str, float]
]:
    """Stage 3: fit v̂ on the replay window (this step + previous ones) and the outcome heads."""
    cfg = s.cfg.train
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
    m = rescored[rescored["traj_id"].isin(rho.index)]
    dec = decisions.loc[m.index]
    out = fit_outcome_heads(
        s.outcome_heads,
        torch.tensor(m["h_rho"].tolist(), dtype=torch.float32),
        torch.tensor(dec["features"].tolist(), dtype=torch.float32),
        torch.tensor(m["traj_id"].map(rho["reward"]).tolist(), dtype=torch.float32),
        hcfg,
    )
    metrics = {"value_mse": mse, "outcome_bce": out["bce"], "outcome_mse": out["mse"]}
    return _cpu(s.value_head.state_dict()), _cpu(s.outcome_heads.state_dict()), new_window, metrics


# --- stage 4: statistics and the AnchorTB update ---------------------------------------------
def update_stage(
    s: Session,
    trajectories: pd.DataFrame,
    decisions: pd.DataFrame,
    rescored: pd.DataFrame,
    actor_optimizer: dict[str, Any],
    *,
    nonfinite_steps: int = 0,
) -> dict[str, Any]:
    """Stage 4 (docs/method.md §1.9 steps 6–7): anchors, buckets (one step behind), one AdamW step.

    A non-finite loss or gradient norm skips the AdamW step (parameters and optimizer state
    stay as they were; the measured statistics are still recorded) and counts towards
    ``train.max_nonfinite_steps``; ``nonfinite_steps`` is the run's count before this step.
    """
    acfg = s.pool.config
    traj = trajectories.set_index("traj_id")
    natural_rho = traj[(traj["arm"] == "rho") & traj["healthy"] & traj["complete"]]
    # anchor AUC: p̂ from the pool *before* this step's rollouts, vs reference success
    anchor_auc = auc(
        [s.pool.anchor(r.record_id, r.family).p_hat for r in natural_rho.itertuples()],
        [int(x >= 0.5) for x in natural_rho["reward"]],
    )
    for r in natural_rho.itertuples():
        s.pool.add(r.record_id, r.family, float(r.reward))
    scored = traj[traj["healthy"] & traj["complete"]]
    u = {
        tid: s.pool.anchor(
            r.record_id, r.family, leave_out=float(r.reward) if tid in natural_rho.index else None
        ).u
        for tid, r in scored.iterrows()
    }
    built = _trajectory_batch(s, scored, decisions, rescored, u)
    objective = build_objective("anchortb", beta=acfg.beta)
    opt = _actor_optimizer(s.cfg, s.policy, s.flow_head)
    opt.load_state_dict(actor_optimizer)
    opt.zero_grad(set_to_none=True)
    out = objective(built.batch)
    out.loss.backward()  # ψ gets its gradient; the leaf Δℓ gets Γ_t
    _backprop_actor(s, built.rows, built.delta.grad)
    params = s.policy.trainable_parameters() + list(s.flow_head.parameters())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, s.cfg.train.grad_clip))
    skipped = not (math.isfinite(out.metrics["loss"]) and math.isfinite(grad_norm))
    if skipped:
        step = int(trajectories["step"].iloc[0])
        nonfinite_steps = _count_nonfinite_step(
            s.cfg, step, nonfinite_steps, out.metrics["loss"], grad_norm
        )
    else:
        opt.step()
    # this step's visits go to the pending buckets, readable from the next step on
    eligible = scored[scored["arm"] != "theta"]
    by_traj = dict(tuple(decisions.groupby("traj_id", sort=False)))
    for tid, r in eligible.iterrows():
        d = by_traj[tid]
        states = [StateKeys(e, c) for e, c in zip(d["exact_key"], d["coarse_key"], strict=True)]
        states.append(StateKeys(r.terminal_exact_key, r.terminal_coarse_key))
        s.buckets.add_trajectory(states, acfg.log_reward(float(r.reward)), u[tid])
    s.buckets.commit()
    metrics = dict(out.metrics)
    metrics.update(
        anchor_auc=anchor_auc,
        grad_norm=grad_norm,
        reward_theta=float(traj[traj["arm"] == "theta"]["reward"].mean()),
        reward_rho=float(traj[traj["arm"] == "rho"]["reward"].mean()),
        n_trajectories=float(len(scored)),
        nonfinite_skipped=float(skipped),
        nonfinite_steps=float(nonfinite_steps),
    )
    return {
        "adapter": s.policy.adapter_state(),
        "flow_head": _cpu(s.flow_head.state_dict()),
        "actor_optimizer": actor_optimizer if skipped else _cpu_tree(opt.state_dict()),
        "pool": s.pool.to_dict(),
        "buckets": s.buckets.to_dict(),
        "nonfinite_steps": nonfinite_steps,
        "metrics": metrics,
    }


class NonFiniteStepsError(RuntimeError):
    """More update steps had a non-finite loss or gradient than ``train.max_nonfinite_steps``."""


def _count_nonfinite_step(
    cfg: RunConfig, step: int, before: int, loss: float, grad_norm: float
) -> int:
    """The run's count of skipped steps including this one; past the limit the run stops."""
    count = before + 1
    limit = cfg.train.max_nonfinite_steps
    what = f"step {step}: non-finite loss ({loss}) or gradient norm ({grad_norm})"
    if count > limit:
        raise NonFiniteStepsError(
            f"{what}; {count} such steps in this run exceed train.max_nonfinite_steps = "
            f"{limit}, so the run stops here (the steps before it are kept)"
        )
    _log.warning(
        "%s: AdamW step skipped (%d of at most %d such steps, train.max_nonfinite_steps)",
        what,
        count,
        limit,
    )
    return count


@dataclass
class _Batch:
    """A padded batch plus the leaf Δℓ of each decision row it was built from."""

    batch: TrajectoryBatch
    rows: pd.DataFrame
    delta: torch.Tensor


def _trajectory_batch(
    s: Session,
    scored: pd.DataFrame,
    decisions: pd.DataFrame,
    rescored: pd.DataFrame,
    u: dict[str, float],
) -> _Batch:
    """Pad the scored trajectories into a :class:`TrajectoryBatch`.

    Δℓ_t = ℓ_θ − ℓ_ρ comes from the re-scoring stage (same parameters, same prompt, tokens and
    mask) as a *leaf* tensor: the objective's gradient with respect to it is Γ_t, which
    :func:`_backprop_actor` turns into the θ-gradient Σ_t Γ_t ∇ℓ_θ (docs/method.md §1.7, A.22).
    b_ψ is computed here with its graph, so ψ gets its gradient from the loss directly.
    """
    acfg = s.pool.config
    d = decisions.assign(
        logp_theta=rescored["logp_theta"].to_numpy(),
        logp_rho=rescored["logp_rho"].to_numpy(),
        h_rho=rescored["h_rho"],
    )
    d = d[d["traj_id"].isin(scored.index)]
    # saturate at the float32 range: a finite Δℓ too large for float32 gives an infinite loss
    # (a skipped update) instead of a non-finite input
    big = float(np.finfo(np.float32).max)
    delta_all = torch.tensor(
        (d["logp_theta"] - d["logp_rho"]).clip(-big, big).to_numpy(),
        dtype=torch.float32,
        requires_grad=True,
    )
    h = torch.tensor(d["h_rho"].tolist(), dtype=torch.float32)
    f = torch.tensor(d["features"].tolist(), dtype=torch.float32)
    b_states = s.flow_head(h, f)
    keys = [StateKeys(e, c) for e, c in zip(d["exact_key"], d["coarse_key"], strict=True)]
    c_states = torch.tensor(s.buckets.corrections(keys), dtype=torch.float32)
    ids = list(scored.index)
    pos = {tid: i for i, tid in enumerate(ids)}
    n_b, n_t = len(ids), int(scored["n_actions"].max())
    row = torch.tensor(d["traj_id"].map(pos).to_numpy())
    col = torch.tensor(d["t"].to_numpy())
    delta = torch.zeros(n_b, n_t).index_put((row, col), delta_all)
    b = torch.zeros(n_b, n_t + 1).index_put((row, col), b_states)
    c = torch.zeros(n_b, n_t + 1).index_put((row, col), c_states)
    lengths = torch.tensor(scored["n_actions"].to_numpy(), dtype=torch.long)
    rewards = [float(x) for x in scored["reward"]]
    batch = TrajectoryBatch(
        delta_logp=delta,
        action_mask=torch.arange(n_t)[None, :] < lengths[:, None],
        lengths=lengths,
        u=torch.tensor([u[t] for t in ids], dtype=torch.float32),
        c=c,
        b=b,
        log_reward=torch.tensor([acfg.log_reward(x) for x in rewards], dtype=torch.float32),
        rewards=torch.tensor(rewards, dtype=torch.float32),
    )
    return _Batch(batch, d, delta_all)


def _backprop_actor(s: Session, rows: pd.DataFrame, gamma: torch.Tensor, chunk: int = 64) -> None:
    """Accumulate Σ_t Γ_t ∇_θ ℓ_θ(a_t|s_t) into the LoRA gradients, one micro-batch at a time.

    Only decisions with more than one legal action have a θ-dependent ℓ (a single legal action
    scores 0 under θ and ρ alike), so only those are re-scored with a graph. Micro-batches
    follow the prompts' text order, so each holds decisions of few tasks and their shared
    prompt head runs once (``score_actions``); the order is fixed, so runs stay bitwise.
    """
    multi = np.flatnonzero((rows["legal"].map(len) > 1).to_numpy())
    multi = multi[np.argsort(rows["prompt"].to_numpy()[multi], kind="stable")]
    for start in range(0, len(multi), chunk):
        idx = multi[start : start + chunk]
        sub = rows.iloc[idx]
        scores = s.policy.score(
            sub["prompt"].tolist(),
            sub["action"].tolist(),
            sub["legal"].tolist(),
            use_adapter=True,
            requires_grad=True,
        )
        weights = gamma[torch.from_numpy(idx)].detach().to(scores.device)
        (weights * scores.float()).sum().backward()


# --- the whole step and the plain loop ---------------------------------------------------------
def train_step(s: Session, state: TrainState, step: int) -> tuple[TrainState, dict[str, float]]:
    """One full step in-process (the Flyte workflow runs the same stages as separate tasks)."""
    trajectories, decisions = rollout_stage(s, step)
    rescored = rescore_stage(s, decisions)
    value_sd, outcome_sd, window, vmetrics = value_stage(
        s, trajectories, decisions, rescored, state.value_window
    )
    upd = update_stage(
        s,
        trajectories,
        decisions,
        rescored,
        state.actor_optimizer,
        nonfinite_steps=state.nonfinite_steps,
    )
    skills, smetrics = validation_stage(s, trajectories, decisions, step)
    new_state = checkpoint_stage(
        state, step, value_sd, outcome_sd, window, upd, skills, seed=s.cfg.train.seed
    )
    return new_state, {**upd["metrics"], **vmetrics, **smetrics}


def validation_stage(
    s: Session, trajectories: pd.DataFrame, decisions: pd.DataFrame, step: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """Stage 5: paired W/L/T, the author window and the sequential tests (docs/method.md §1.8)."""
    prompts = {r.record_id: r.prompt for r in s.world.train_records}
    metrics = s.skills.validation_round(
        trajectories, decisions, prompts, step, s.world.executor, s.cfg.train.seed
    )
    return s.skills.to_dict(), metrics


def checkpoint_stage(
    state: TrainState,
    step: int,
    value_sd: dict,
    outcome_sd: dict,
    window: list,
    upd: dict,
    skills: dict[str, Any],
    *,
    seed: int,
) -> TrainState:
    """Stage 6: the next state (adapter, heads, optimizer, statistics, skills, RNG)."""
    return TrainState(
        step=step,
        adapter=upd["adapter"],
        flow_head=upd["flow_head"],
        value_head=value_sd,
        outcome_heads=outcome_sd,
        actor_optimizer=upd["actor_optimizer"],
        pool=upd["pool"],
        buckets=upd["buckets"],
        value_window=window,
        skills=skills,
        rng_state=_rng_state(seed, step),
        nonfinite_steps=upd["nonfinite_steps"],
    )


def evaluation_rollouts(
    s: Session,
    records: list[TaskRecord],
    use_adapter: bool,
    runs: int = 1,
    tag: str = "eval",
    menus: dict | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Trajectories and decisions of π_θ (or ρ) on ``records`` (no pairs, no updates), with the
    session's menus or the given ``menus``; θ and ρ runs of the same tag share every seed."""
    arm = "theta" if use_adapter else "rho"
    plans = [EpisodePlan(r, arm, k, evaluation=True) for r in records for k in range(runs)]
    ctx = _rollout_context(s, derive_seed(s.cfg.train.seed, tag), 0, menus, evaluation=True)
    return collect_rollouts(s.policy, plans, ctx)


def evaluate_policy(
    s: Session,
    records: list[TaskRecord],
    use_adapter: bool,
    runs: int = 1,
    tag: str = "eval",
    menus: dict | None = None,
) -> float:
    """Mean reward of :func:`evaluation_rollouts`."""
    trajectories, _ = evaluation_rollouts(s, records, use_adapter, runs, tag, menus)
    return float(trajectories["reward"].mean())


def train(
    cfg: RunConfig,
    steps: int | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[TrainState, list[dict[str, float]]]:
    """Plain-Python loop over the configured number of steps (no Flyte)."""
    state = init_state(cfg)
    world = build_world(cfg)
    history = []
    for step in range(1, (steps or cfg.train.steps) + 1):
        s = open_session(cfg, state, world)
        state, metrics = train_step(s, state, step)
        metrics = {k: float(v) for k, v in metrics.items()}
        history.append(metrics)
        if on_step:
            on_step(step, metrics)
    return state, history
