"""The live objects of one training step, rebuilt from a config and a train state.

A :class:`Session` holds the policy, the heads, the anchor statistics and the skill state of
the state it was opened on, plus the episode world; the stages read and update it. The config
decides every constant: a state made under other anchor constants is refused
(:func:`check_anchor_constants`), never silently continued. The step-0
state (:func:`init_state`) and the actor optimizer are built here too, so that a state and the
session opened on it always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from evosteer_core.anchors import AnchorConfig, ShrinkagePool, StructuralBuckets
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.rollout import RolloutContext
from evosteer_core.episode.world import World, build_world, load_records
from evosteer_core.executors.base import Executor
from evosteer_core.infra.config import RunConfig, SkillsConfig
from evosteer_core.infra.configio import InputError
from evosteer_core.infra.seeding import derive_seed, torch_generator
from evosteer_core.objectives import Objective, objective_from_config
from evosteer_core.objectives.anchortb import AnchorTB
from evosteer_core.policy.orchestrator import Orchestrator, build_orchestrator
from evosteer_core.sim.executor import SimExecutor
from evosteer_core.skills.admission import SkillState
from evosteer_core.training.heads import FlowCorrection, OutcomeHeads, ValueHead
from evosteer_core.training.state import TrainState


def anchor_config(cfg: RunConfig) -> AnchorConfig:
    """The anchor statistics' constants: β from ``train``, the rest from ``anchors``.

    The one place they are assembled: the statistics carry a copy in the checkpoint only so
    that a state made under other constants is recognised and refused
    (:func:`check_anchor_constants`); the stages read the session's ``anchors``, which is
    this function of the run's config."""
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


ANCHOR_KEYS = {
    "beta": "train.beta",
    "kappa_g": "anchors.kappa[0]",
    "kappa_c": "anchors.kappa[1]",
    "kappa_q": "anchors.kappa[2]",
    "prior_cap": "anchors.record_prior_cap",
    "n0": "anchors.n0",
    "c_max": "anchors.c_max",
    "min_visits": "anchors.min_visits",
}
"""The config key of each anchor constant."""


class CheckpointMismatchError(InputError):
    """A train state was made with other anchor constants than the config now sets."""


def check_anchor_constants(state: TrainState, acfg: AnchorConfig) -> None:
    """The config decides; a state whose statistics were gathered under other constants is
    refused (never silently continued under either value): β and the shrinkage constants
    shape every statistic the state holds, so a run cannot change them midway."""
    want = acfg.to_dict()
    for what in ("pool", "buckets"):
        stored = getattr(state, what).get("config") if getattr(state, what) else None
        for name, value in (stored or {}).items():
            if want.get(name) != value:
                raise CheckpointMismatchError(
                    f"the train state of step {state.step} was made with {ANCHOR_KEYS[name]} = "
                    f"{value}, the config says {want.get(name)}: a run keeps its anchor "
                    "constants; start a new run (another name or store) to change them"
                )


def record_slots(records: Sequence[TaskRecord]) -> dict[str, int]:
    """Each training record's index in id order: the rows of the learned per-record flows
    (ablation ``no_measured_flows``)."""
    return {rid: i for i, rid in enumerate(sorted({r.record_id for r in records}))}


def build_objective(cfg: RunConfig, hidden_size: int, records: Sequence[TaskRecord]) -> Objective:
    """The run's objective; with ablation ``no_measured_flows`` (AnchorTB only, checked by
    the config) it learns one u per training record instead of reading the anchor."""
    objective = objective_from_config(cfg, hidden_size=hidden_size)
    if cfg.ablation.no_measured_flows:
        assert isinstance(objective, AnchorTB)  # RunConfig checks train.objective
        objective.learn_record_flows(len(record_slots(records)))
    return objective


def skills_config(cfg: RunConfig) -> SkillsConfig:
    """``cfg.skills``, switched off by ablation ``no_skill_evolution`` (no author, no
    candidates, no pairs, an empty library; docs/ablations.md)."""
    return replace(cfg.skills, enabled=False) if cfg.ablation.no_skill_evolution else cfg.skills


def admit_after(cfg: RunConfig) -> int | None:
    """k of fixed-count admission under ablation ``no_sequential_validation``; None: the
    sequential tests decide."""
    ab = cfg.ablation
    return ab.validation_successes if ab.no_sequential_validation else None


def actor_optimizer(
    cfg: RunConfig, policy: Orchestrator, flow: FlowCorrection, objective: Objective
) -> torch.optim.AdamW:
    """AdamW with the parameter groups clipped together: LoRA (actor lr), b_ψ (heads lr) and,
    when the objective learns scalars of its own (TB's log Z), those (heads lr)."""
    t = cfg.train
    groups = [
        {"params": policy.trainable_parameters(), "lr": t.actor.lr, "betas": t.actor.betas},
        {"params": list(flow.parameters()), "lr": t.heads.lr, "betas": t.heads.betas},
    ]
    own = list(objective.parameters())
    if own:
        groups.append({"params": own, "lr": t.heads.lr, "betas": t.heads.betas})
    return torch.optim.AdamW(groups, weight_decay=t.actor.weight_decay)


@dataclass
class Session:
    """Objects rebuilt from a config and a state: the policy, heads, world and statistics."""

    cfg: RunConfig
    world: World
    policy: Orchestrator
    value_head: ValueHead
    flow_head: FlowCorrection
    outcome_heads: OutcomeHeads
    objective: Objective
    anchors: AnchorConfig
    pool: ShrinkagePool
    buckets: StructuralBuckets
    skills: SkillState

    def rollout_context(
        self, run_seed: int, step: int, menus: dict | None = None, *, evaluation: bool
    ) -> RolloutContext:
        """The frozen context of a rollout batch: menus, v̂ snapshot, budgets, renderer, and
        the reward: the official one for evaluation, the configured training reward otherwise.
        Unless ``menus`` are given, training offers the candidates under test and evaluation
        only the validated skills (docs/method.md, test-time protocol)."""
        if menus is None:
            menus = self.skills.deployed_menus() if evaluation else self.skills.menus()
        return RolloutContext(
            catalogue=self.world.catalogue,
            limits=self.cfg.budget,
            executor=self.world.executor,
            evaluator=self.world.evaluator if evaluation else self.world.train_evaluator,
            menus=menus,
            value_head=self.value_head,
            run_seed=run_seed,
            step=step,
            renderer=self.cfg.policy.renderer,
            temperature=self.cfg.policy.temperature,
            decision_clock=decision_clock(self.world.executor),
            max_consecutive_failures=self.cfg.executor.max_consecutive_failures,
            min_healthy_fraction=self.cfg.executor.min_healthy_fraction,
            interleaved=not self.cfg.ablation.no_interleaving,
            repair=not self.cfg.ablation.no_repair,
            withheld=self.cfg.ablation.withheld_state(),
            concurrency=self.cfg.executor.concurrency,
        )


def decision_clock(executor: Executor) -> Callable[[int, int], float] | None:
    """The sim's simulated decision time (deterministic runs); None (measured) otherwise."""
    return executor.decision_seconds if isinstance(executor, SimExecutor) else None


def open_session(cfg: RunConfig, state: TrainState, world: World | None = None) -> Session:
    """Rebuild live objects from ``state`` (cheap: the tiny backbone loads in well under 1 s)."""
    seed = cfg.train.seed
    policy = build_orchestrator(cfg)
    policy.load_adapter_state(state.adapter)
    value = ValueHead(seed=derive_seed(seed, "value_head"))
    flow = FlowCorrection(policy.hidden_size, seed=derive_seed(seed, "flow_head"))
    outcome = OutcomeHeads(policy.hidden_size, seed=derive_seed(seed, "outcome_heads"))
    for head, saved in (
        (value, state.value_head),
        (flow, state.flow_head),
        (outcome, state.outcome_heads),
    ):
        if saved:  # a CollabFlow state has no heads (collabflow.rounds): they stay fresh
            head.load_state_dict(saved)
    value.eval()
    acfg = anchor_config(cfg)
    check_anchor_constants(state, acfg)
    world = world or build_world(cfg)
    objective = build_objective(cfg, policy.hidden_size, world.train_records)
    if state.objective:
        objective.load_state_dict(state.objective)
    pool = ShrinkagePool.from_dict(state.pool) if state.pool else ShrinkagePool(acfg)
    buckets = (
        StructuralBuckets.from_dict(state.buckets) if state.buckets else StructuralBuckets(acfg)
    )
    return Session(
        cfg=cfg,
        world=world,
        policy=policy,
        value_head=value,
        flow_head=flow,
        outcome_heads=outcome,
        objective=objective,
        anchors=acfg,
        pool=pool,
        buckets=buckets,
        skills=SkillState.from_dict(state.skills, skills_config(cfg), admit_after(cfg)),
    )


def init_state(cfg: RunConfig) -> TrainState:
    """Step-0 state: fresh adapter (LoRA B = 0, so θ = ρ), fresh heads, empty statistics."""
    seed = cfg.train.seed
    torch.manual_seed(derive_seed(seed, "torch_global"))
    policy = build_orchestrator(cfg)
    flow = FlowCorrection(policy.hidden_size, seed=derive_seed(seed, "flow_head"))
    records = load_records(cfg)[0] if cfg.ablation.no_measured_flows else []
    objective = build_objective(cfg, policy.hidden_size, records)
    opt = actor_optimizer(cfg, policy, flow, objective)
    acfg = anchor_config(cfg)
    return TrainState(
        step=0,
        adapter=policy.adapter_state(),
        flow_head=cpu_state(flow.state_dict()),
        value_head=cpu_state(ValueHead(seed=derive_seed(seed, "value_head")).state_dict()),
        outcome_heads=cpu_state(
            OutcomeHeads(policy.hidden_size, seed=derive_seed(seed, "outcome_heads")).state_dict()
        ),
        actor_optimizer=cpu_tree(opt.state_dict()),
        pool=ShrinkagePool(acfg).to_dict(),
        buckets=StructuralBuckets(acfg).to_dict(),
        value_window=[],
        skills=SkillState.initial(skills_config(cfg), admit_after(cfg)).to_dict(),
        rng_state=rng_state(cfg.train.seed, 0),
        objective=cpu_state(objective.state_dict()),
    )


def rng_state(seed: int, step: int) -> torch.Tensor:
    """The RNG state a checkpoint records: derived from (run seed, step), so it does not depend
    on what else ran in the process (every draw of the loop uses its own derived generator)."""
    return torch_generator(seed, step, "torch_global").get_state()


def cpu_state(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict detached and copied to the CPU."""
    return {k: v.detach().cpu().clone() for k, v in sd.items()}


def cpu_tree(obj: Any) -> Any:
    """Every tensor in a nested dict/list moved to the CPU (checkpoints are device-free)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: cpu_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_tree(v) for v in obj)
    return obj
