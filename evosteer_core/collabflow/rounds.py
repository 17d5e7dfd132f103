"""CollabFlow's training rounds (docs/collabflow.md §4): one round is one training step.

A round k: the director θ_k builds a team for each task of the batch and the frozen executor
runs it (:func:`round_rollout`); CTB updates θ, log Z_ψ and b_φ on the valid constructions
with π_ref = θ_k, the director that collected the batch, whose legal-set log-probabilities the
rollout recorded, and the team rewards R̃ read the reliability counters frozen before the batch;
after the update the counters count each unique outcome of the batch once
(:func:`round_update`); the checkpoint carries the adapter, the objective's state (log Z_ψ,
b_φ), the optimizer, the counters and the RNG state (:func:`round_checkpoint`).

The state is a :class:`~evosteer_core.training.state.TrainState` whose EvoSteer-only parts
(heads, anchor statistics, skills) are empty and whose ``counters`` hold the reliability
counters; the stages run through the pipeline's per-method stage table
(``pipeline/stage_io.METHODS``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from evosteer_core.collabflow.ctb_batch import CTBTrajectory, ScoredDecision, ctb_batch
from evosteer_core.collabflow.director import legal_logprobs
from evosteer_core.collabflow.reward import (
    CounterSnapshot,
    Outcome,
    ReliabilityCounters,
    is_success,
    outcome_id,
    team_reward,
)
from evosteer_core.collabflow.rollout import (
    CollabContext,
    CollabPlan,
    episode_usage,
    rollout_tables,
    run_episodes,
    spec_for,
)
from evosteer_core.collabflow.team import BuildAction, decode
from evosteer_core.episode.budget import TokenUsage
from evosteer_core.episode.world import World, build_world
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.objectives import Objective, TrajectoryBatch, objective_from_config
from evosteer_core.policy.orchestrator import Orchestrator, build_orchestrator
from evosteer_core.training.results import Rollouts, StageObject
from evosteer_core.training.session import cpu_state, cpu_tree, decision_clock, rng_state
from evosteer_core.training.stages import sample_batch
from evosteer_core.training.state import TrainState
from evosteer_core.training.update import count_nonfinite_step


@dataclass
class RoundSession:
    """The live objects of a round, rebuilt from a config and a state."""

    cfg: RunConfig
    world: World
    director: Orchestrator
    objective: Objective
    counters: ReliabilityCounters

    def context(self, step: int, *, evaluation: bool) -> CollabContext:
        """The episodes' shared context: the training reward, or the official one."""
        w = self.world
        return CollabContext(
            cfg=self.cfg,
            catalogue=w.catalogue,
            executor=w.executor,
            evaluator=w.evaluator if evaluation else w.train_evaluator,
            run_seed=self.cfg.train.seed,
            step=step,
            decision_clock=decision_clock(w.executor),
        )


def director_optimizer(
    cfg: RunConfig, director: Orchestrator, objective: Objective
) -> torch.optim.AdamW:
    """AdamW over the adapter (actor lr) and the objective's parameters, log Z_ψ and b_φ
    (heads lr)."""
    t = cfg.train
    groups = [{"params": director.trainable_parameters(), "lr": t.actor.lr, "betas": t.actor.betas}]
    own = list(objective.parameters())
    if own:
        groups.append({"params": own, "lr": t.heads.lr, "betas": t.heads.betas})
    return torch.optim.AdamW(groups, weight_decay=t.actor.weight_decay)


def init_round_state(cfg: RunConfig) -> TrainState:
    """Round 0: a fresh adapter (θ = ρ), a fresh objective, empty counters."""
    seed = cfg.train.seed
    torch.manual_seed(derive_seed(seed, "torch_global"))
    director = build_orchestrator(cfg)
    objective = objective_from_config(cfg)
    opt = director_optimizer(cfg, director, objective)
    return TrainState(
        step=0,
        adapter=director.adapter_state(),
        flow_head={},
        value_head={},
        outcome_heads={},
        actor_optimizer=cpu_tree(opt.state_dict()),
        pool={},
        buckets={},
        rng_state=rng_state(seed, 0),
        objective=cpu_state(objective.state_dict()),
        counters=ReliabilityCounters().to_dict(),
    )


def open_round(cfg: RunConfig, state: TrainState, world: World | None = None) -> RoundSession:
    """The live director, objective and counters of ``state``."""
    director = build_orchestrator(cfg)
    director.load_adapter_state(state.adapter)
    objective = objective_from_config(cfg)
    objective.load_state_dict(state.objective)
    return RoundSession(
        cfg=cfg,
        world=world or build_world(cfg),
        director=director,
        objective=objective,
        counters=ReliabilityCounters.from_dict(state.counters),
    )


def round_plans(s: RoundSession, step: int) -> list[CollabPlan]:
    """The round's batch (source-balanced, as EvoSteer's) × ``train.rollouts_theta``."""
    t = s.cfg.train
    batch = sample_batch(s.world.train_records, t.batch_size, t.seed, step)
    return [CollabPlan(r, "theta", k) for r in batch for k in range(t.rollouts_theta)]


def round_rollout(s: RoundSession, step: int, shard: int = 0, n_shards: int = 1) -> Rollouts:
    """The round's episodes under θ_k (``shard::n_shards`` of its plans) as tables."""
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is not in 0..{n_shards - 1}")
    plans = round_plans(s, step)[shard::n_shards]
    episodes = run_episodes(s.director.policy, plans, s.context(step, evaluation=False))
    traj, dec = rollout_tables(episodes, step)
    usage: TokenUsage = episode_usage(episodes)
    return Rollouts(traj, dec, usage)


@dataclass
class RoundUpdate(StageObject):
    """A round's update: adapter, objective state (log Z_ψ, b_φ), optimizer, the counters
    after the batch, the run's count of skipped updates, metrics."""

    adapter: dict[str, torch.Tensor]
    objective: dict[str, torch.Tensor]
    actor_optimizer: dict
    counters: dict
    nonfinite_steps: int
    metrics: dict[str, float]


def trained_rows(trajectories: pd.DataFrame) -> pd.DataFrame:
    """The trajectories CTB trains on: valid constructions whose execution was healthy."""
    return trajectories[~trajectories["aborted"] & trajectories["healthy"]]


class RoundBatch:
    """The round's valid constructions as CTB's gradient source: log π̄_θ over every legal
    set is recomputed with its graph into the adapter (so ``backprop_actor`` has nothing left
    to do), the recorded log-probabilities are π_ref's."""

    def __init__(
        self,
        s: RoundSession,
        trained: pd.DataFrame,
        decisions: pd.DataFrame,
        snapshot: CounterSnapshot,
    ) -> None:
        self._s, self._trained, self._snapshot = s, trained, snapshot
        self._by_traj = dict(tuple(decisions.groupby("traj_id", sort=False)))
        self.rewards: list[float] = []

    def batch(self) -> TrajectoryBatch:
        s, c = self._s, self._s.cfg.collabflow
        assert c is not None
        records = {r.record_id: r for r in s.world.train_records}
        ctx = s.context(0, evaluation=False)
        policy = s.director.policy
        trajectories = []
        for row in self._trained.itertuples():
            d = self._by_traj[row.traj_id]
            spec = spec_for(records[row.record_id], ctx)
            actions = [BuildAction.parse(a) for a in d["action"]]
            team = decode(actions, spec)
            steps = []
            for prompt, legal, chosen, ref in zip(
                d["prompt"], d["legal"], d["chosen"], d["legal_logp"], strict=True
            ):
                ref_t = torch.tensor(ref, dtype=torch.float32)
                theta = (
                    legal_logprobs(policy, prompt, legal, use_adapter=True, requires_grad=True)
                    if len(legal) > 1
                    else torch.zeros(1)
                )
                steps.append(ScoredDecision(theta.cpu(), ref_t, int(chosen)))
            reward = team_reward(
                float(row.r_ans),
                team,
                spec,
                row.family,
                self._snapshot,
                eps_min=c.eps_min,
                mdl_lambda=c.mdl_lambda,
            )
            self.rewards.append(reward)
            trajectories.append(CTBTrajectory(steps, actions, team, row.family, reward))
        return ctb_batch(trajectories, c.backward)

    def backprop_actor(self) -> None:
        """Nothing: the loss's backward already reached θ through ``legal_logp``."""


def round_outcomes(trained: pd.DataFrame) -> list[Outcome]:
    """The batch's unique outcomes for the counters (one per executed valid team)."""
    return [
        Outcome(
            outcome_id(r.record_id, r.team_hash, r.seed_key),
            r.team_hash,
            r.family,
            is_success(float(r.r_ans)),
        )
        for r in trained.itertuples()
    ]


def round_update(
    s: RoundSession, rollouts: Rollouts, optimizer_state: dict, *, nonfinite_steps: int = 0
) -> RoundUpdate:
    """CTB on the round's valid constructions (rewards from the pre-batch counters), one
    AdamW step (skipped for an empty batch, a non-finite loss, or — ablation −recursion,
    ``collabflow.recursion: false`` — any round after the first), then the counters count the
    batch's outcomes."""
    traj, dec = rollouts.trajectories, rollouts.decisions
    step = int(traj["step"].iloc[0])
    trained = trained_rows(traj)
    snapshot = s.counters.snapshot()  # frozen before the batch: every R̃ reads it
    opt = director_optimizer(s.cfg, s.director, s.objective)
    opt.load_state_dict(optimizer_state)
    opt.zero_grad(set_to_none=True)
    metrics: dict[str, float] = {}
    recursion = s.cfg.collabflow is None or s.cfg.collabflow.recursion
    retrain = recursion or step == 1  # −recursion: trained in round 1, never again (§5)
    skipped = trained.empty or not retrain
    nonfinite = False
    if not skipped:
        source = RoundBatch(s, trained, dec, snapshot)
        out = s.objective.accumulate(source)
        params = s.director.trainable_parameters() + list(s.objective.parameters())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, s.cfg.train.grad_clip))
        nonfinite = not (math.isfinite(out.metrics["loss"]) and math.isfinite(grad_norm))
        skipped = nonfinite
        if nonfinite:
            nonfinite_steps = count_nonfinite_step(
                s.cfg, step, nonfinite_steps, out.metrics["loss"], grad_norm
            )
        else:
            opt.step()
        metrics.update(
            out.metrics, grad_norm=grad_norm, team_reward=sum(source.rewards) / len(source.rewards)
        )
    new = s.counters.update(round_outcomes(trained))
    metrics.update(
        reward_theta=float(traj["r_ans"].mean()),
        abort_rate=float(traj["aborted"].mean()),
        n_trajectories=float(len(trained)),
        unique_teams=float(trained["team_hash"].nunique()),
        new_outcomes=float(new),
        construction_tokens=float(traj["construction_tokens"].mean()),
        nonfinite_skipped=float(nonfinite),
        retrained=float(retrain and not trained.empty),
        nonfinite_steps=float(nonfinite_steps),
    )
    return RoundUpdate(
        adapter=s.director.adapter_state(),
        objective=cpu_state(s.objective.state_dict()),
        actor_optimizer=optimizer_state if skipped else cpu_tree(opt.state_dict()),
        counters=s.counters.to_dict(),
        nonfinite_steps=nonfinite_steps,
        metrics=metrics,
    )


def round_checkpoint(state: TrainState, step: int, update: RoundUpdate, *, seed: int) -> TrainState:
    """The next state from the round's update."""
    return TrainState(
        step=step,
        adapter=update.adapter,
        flow_head={},
        value_head={},
        outcome_heads={},
        actor_optimizer=update.actor_optimizer,
        pool={},
        buckets={},
        rng_state=rng_state(seed, step),
        nonfinite_steps=update.nonfinite_steps,
        objective=update.objective,
        counters=update.counters,
    )
