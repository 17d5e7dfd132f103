"""Batched, lock-step rollout collection (docs/method.md §1.9 step 2).

All pending decisions of all episodes are sampled together: one batched policy call for the
θ episodes (adapter on) and one for the ρ-driven episodes (adapter off) per round. A decision
with a single legal action, and the forced first action of a paired arm, is recorded but not
sampled. The value-head snapshot v̂ (and its one-step change Δv̂) is shown in every prompt.
Each decision row names the policy that sampled it (``sampled_by``: ``theta``, ``rho``, or
empty when forced); its ``logp_sample`` is ℓ under that policy, and a ρ-sampled row keeps
h_ρ of its prompt from the same pass, so the re-score stage need not recompute them.

Each sampled decision is charged to its episode's ledger before its action executes (prompt and
action tokens, and its time); forced decisions make no model call and cost nothing. A decision
the budget cannot cover, or one that took longer than ``decision_deadline_s``, is replaced by
the finalizing action of docs/method.md §1.2 (docs/runtime.md, "Orchestrator decisions").

The actions of a round belong to different episodes, so with ``executor.concurrency`` > 1
they run at once in a thread pool (a real model server then batches the node calls); every
request carries its own seed, each episode's state is its own, the rows are kept in decision
order, and the breaker counts a round's outcomes in episode order, so the tables do not depend
on which reply came back first.

Node executions go through a :class:`CircuitBreaker`: an episode stops at its first
infrastructure failure, the rollout stops calling the executor after
``max_consecutive_failures`` in a row, and a rollout whose healthy fraction is below
``min_healthy_fraction`` raises :class:`ExecutorOutageError` instead of returning tables that
would be stored and cached (docs/reliability.md, "Executor outages").
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import pandas as pd
import torch

from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.features import execution_features
from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.roles import Catalogue
from evosteer_core.episode.runtime import DecisionCharge, Episode, Evaluator
from evosteer_core.executors.base import Executor, SkillView
from evosteer_core.executors.breaker import (
    DEFAULT_MAX_CONSECUTIVE_FAILURES,
    DEFAULT_MIN_HEALTHY_FRACTION,
    CircuitBreaker,
    ExecutorOutageError,
)
from evosteer_core.infra.schemas import validate_tables
from evosteer_core.infra.seeding import torch_generator
from evosteer_core.policy.orchestrator import Orchestrator
from evosteer_core.policy.render import public_state, render
from evosteer_core.training.heads import ValueHead

FAMILY_INDEX = {f: i for i, f in enumerate(FAMILIES)}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodePlan:
    """One trajectory to collect: which record, which arm, and (for pairs) which skill."""

    record: TaskRecord
    arm: str
    rollout_index: int
    pair_skill: str = ""
    pair_kind: str = ""
    evaluation: bool = False
    """Evaluation episodes of θ and ρ share their seeds (a paired comparison of the policies)."""

    @property
    def traj_id(self) -> str:
        return f"{self.record.record_id}/{self.arm}/{self.rollout_index}"

    @property
    def uses_adapter(self) -> bool:
        return self.arm == "theta"

    def seed_key(self, step: int) -> str:
        """Key of every draw of the episode (executor and sampler); both arms of a pair share
        it, and so do θ and ρ evaluation episodes (common random numbers)."""
        arm = "pair" if self.arm.startswith("pair") else self.arm
        return f"s{step}/{self.record.record_id}/{'eval' if self.evaluation else arm}/{self.rollout_index}"

    def forced_first(self) -> Action | None:
        """The forced first action of a paired arm: ADD_AGENT(n0, solver[, σ])."""
        if self.arm == "pair_treat":
            return Action("ADD_AGENT", node_id="n0", role_id="solver", skill_id=self.pair_skill)
        if self.arm == "pair_control":
            return Action("ADD_AGENT", node_id="n0", role_id="solver")
        return None


@dataclass
class RolloutContext:
    """Everything frozen for one rollout batch (menus and the v̂ snapshot included)."""

    catalogue: Catalogue
    limits: BudgetLimits
    executor: Executor
    evaluator: Evaluator
    menus: dict[str, tuple[SkillView, ...]]
    value_head: ValueHead | None
    """The v̂ snapshot shown in every prompt; None only for fixed paradigms, which see no
    prompt (``paradigms.runner``)."""
    run_seed: int
    step: int
    renderer: str = "compact"
    temperature: float = 1.0
    decision_clock: Callable[[int, int], float] | None = None
    """Seconds charged for a sampled decision from its (prompt, action) tokens (the sim's
    simulated clock); None: the measured wall time of the batched policy call that made it."""
    max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES
    """Consecutive infrastructure failures after which the rollout stops calling the executor."""
    min_healthy_fraction: float = DEFAULT_MIN_HEALTHY_FRACTION
    """Below this healthy fraction of its trajectories the rollout is an executor outage."""
    interleaved: bool = True
    """False: build the graph first, run it at STOP (ablation ``no_interleaving``)."""
    repair: bool = True
    """False: RERUN_AGENT and DROP_AGENT are never legal (ablation ``no_repair``)."""
    withheld: tuple[str, ...] = ()
    """Public-state keys left out of the prompt (ablations ``no_execution_features``,
    ``no_value_head``); the decision table still records f and v̂."""
    concurrency: int = 1
    """How many episodes' actions (node executions) of one round run at once
    (``executor.concurrency``); 1: one after another."""


def run_concurrently(calls: Sequence[Callable[[], object]], workers: int) -> list[object]:
    """Run ``calls`` on up to ``workers`` threads; return their results in order, or raise
    the first call's exception (in call order) once all have ended.

    The threads are daemons: a run stopped while node calls are in flight (Ctrl-C, SIGTERM)
    exits without waiting for their replies, and its exit stops a managed server, which ends
    them (a pool's threads would be joined first, for up to the executor's timeouts)."""
    results: list[object] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)
    todo = iter(range(len(calls)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                k = next(todo, None)
            if k is None:
                return
            try:
                results[k] = calls[k]()
            except BaseException as exc:  # re-raised in the calling thread
                errors[k] = exc

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(workers, len(calls)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for exc in errors:
        if exc is not None:
            raise exc
    return results


def _values(head: ValueHead, feats: list[list[float]], families: list[str]) -> list[float]:
    with torch.no_grad():
        f = torch.tensor(feats, dtype=torch.float32)
        fam = torch.tensor([FAMILY_INDEX[x] for x in families], dtype=torch.long)
        return [float(v) for v in head(f, fam)]


def open_episodes(
    plans: Sequence[EpisodePlan], ctx: RolloutContext, breaker: CircuitBreaker
) -> list[Episode]:
    """One fresh episode per plan under the context's budget, reward, menus and seeds (every
    plan's draws keyed by ``plan.seed_key(ctx.step)``); each runs its nodes through its own
    lane of the rollout's circuit ``breaker`` around ``ctx.executor``. Fixed orchestration paradigms open theirs here too, so
    that they run the very episodes the policy would (common random numbers)."""
    return [
        Episode(
            p.record,
            ctx.catalogue,
            ctx.limits,
            breaker.lane(i),
            ctx.evaluator,
            menu=ctx.menus.get(p.record.family, ()),
            run_seed=ctx.run_seed,
            episode_key=p.seed_key(ctx.step),
            masked_skills=(p.pair_skill,) if p.arm == "pair_control" else (),
            interleaved=ctx.interleaved,
            repair=ctx.repair,
        )
        for i, p in enumerate(plans)
    ]


@dataclass(frozen=True)
class Rollout:
    """A finished rollout: its validated tables and the episodes they were read from (the
    episodes' ledgers hold what the tables do not, e.g. the orchestrator's own tokens)."""

    trajectories: pd.DataFrame
    decisions: pd.DataFrame
    episodes: list[Episode]


def collect_rollouts(
    policy: Orchestrator, plans: Sequence[EpisodePlan], ctx: RolloutContext
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every plan to completion; return validated (trajectories, decisions) tables.

    Raises :class:`ExecutorOutageError` when the healthy fraction is below the floor."""
    done = run_rollouts(policy, plans, ctx)
    return done.trajectories, done.decisions


def run_rollouts(
    policy: Orchestrator, plans: Sequence[EpisodePlan], ctx: RolloutContext
) -> Rollout:
    """:func:`collect_rollouts`, keeping the finished episodes."""
    if ctx.value_head is None:
        raise ValueError("a policy rollout needs the value-head snapshot (ctx.value_head)")
    breaker = CircuitBreaker(ctx.executor, ctx.max_consecutive_failures)
    episodes = open_episodes(plans, ctx, breaker)
    rows = _run_rounds(policy, plans, episodes, ctx, breaker)
    trajectories = pd.DataFrame(
        [
            _trajectory_row(p, ep, ctx.step, n)
            for p, ep, n in zip(plans, episodes, rows.timeouts, strict=True)
        ]
    )
    decisions_df = (
        pd.DataFrame(rows.decisions)
        .sort_values(["traj_id", "t"], kind="stable")
        .reset_index(drop=True)
    )
    validate_tables(trajectories, decisions_df)
    check_health(trajectories, episodes, breaker, ctx, any(p.evaluation for p in plans))
    return Rollout(trajectories, decisions_df, episodes)


@dataclass
class _Rounds:
    """What the lock-step rounds produced: the decision rows and each episode's timeouts."""

    decisions: list[dict]
    timeouts: list[int]


def _run_rounds(
    policy: Orchestrator,
    plans: Sequence[EpisodePlan],
    episodes: Sequence[Episode],
    ctx: RolloutContext,
    breaker: CircuitBreaker,
) -> _Rounds:
    """Decide for every pending episode at once, then apply the round's actions: one after
    another, or (``ctx.concurrency`` > 1) each episode's action and its node execution on
    its own worker thread, the breaker counting the round's outcomes in episode order."""
    prev_value: list[float | None] = [None] * len(plans)
    timeouts = [0] * len(plans)
    rows: list[dict] = []
    while True:
        pending = [i for i, ep in enumerate(episodes) if not ep.stopped]
        if not pending:
            break
        feats = [[float(x) for x in execution_features(episodes[i])] for i in pending]
        values = _values(ctx.value_head, feats, [plans[i].record.family for i in pending])
        decisions = []
        for i, f, v in zip(pending, feats, values, strict=True):
            ep = episodes[i]
            dv = None if prev_value[i] is None else v - prev_value[i]
            prev_value[i] = v
            state = public_state(ep, value=v, value_change=dv, withhold=ctx.withheld)
            legal = state["legal_actions"]
            forced = plans[i].forced_first() if not ep.history else None
            exact, coarse = ep.graph.structure_keys(stopped=False)
            decisions.append(
                {
                    "i": i,
                    "prompt": render(state, ctx.renderer),
                    "legal": legal,
                    "features": f,
                    "value": v,
                    "exact_key": exact,
                    "coarse_key": coarse,
                    "forced_action": forced.to_json() if forced else None,
                    "t": len(ep.history),
                }
            )
        _choose(policy, decisions, plans, episodes, ctx)
        # legal on the state the decision saw; charged before the action executes
        applies = [
            partial(episodes[d["i"]].apply, Action.from_json(d["action"]), d["charge"])
            for d in decisions
        ]
        if ctx.concurrency == 1:
            for apply in applies:
                apply()
        else:
            with breaker.round():
                run_concurrently(applies, ctx.concurrency)
        for d in decisions:
            ep = episodes[d["i"]]
            del d["charge"]
            timeouts[d["i"]] += d.pop("timed_out", False)
            rows.append(
                {
                    "traj_id": plans[d["i"]].traj_id,
                    "t": len(ep.history) - 1,
                    "prompt": d["prompt"],
                    "legal": d["legal"],
                    "chosen": d["chosen"],
                    "action": d["action"],
                    "forced": d["forced"],
                    "features": d["features"],
                    "value": d["value"],
                    "exact_key": d["exact_key"],
                    "coarse_key": d["coarse_key"],
                    "logp_sample": d["logp"],
                    "sampled_by": d["sampled_by"],
                    "h_rho": d["h_rho"],
                }
            )
    return _Rounds(rows, timeouts)


def rollout_health(trajectories: pd.DataFrame) -> dict[str, float]:
    """``infra_failures``: trajectories that hit an infrastructure failure (each stops at its
    first, so this is also the number of failed node executions); ``healthy_fraction``: the
    share of trajectories that did not (1 for an empty table)."""
    n = len(trajectories)
    failed = int((~trajectories["healthy"].astype(bool)).sum()) if n else 0
    return {"infra_failures": failed, "healthy_fraction": (n - failed) / n if n else 1.0}


def check_health(
    trajectories: pd.DataFrame,
    episodes: Sequence[Episode],
    breaker: CircuitBreaker,
    ctx: RolloutContext,
    evaluation: bool,
) -> None:
    """Warn when any trajectory is unhealthy; raise ExecutorOutageError below the floor."""
    where = "in an evaluation rollout" if evaluation else f"at step {ctx.step}"
    health = rollout_health(trajectories)
    if health["infra_failures"] == 0:
        return
    kinds = Counter(
        o.result.failure_kind
        for ep in episodes
        for o in ep.history
        if o.result is not None and o.result.status == "infra_failure"
    )
    n, frac = len(trajectories), health["healthy_fraction"]
    what = (
        f"{health['infra_failures']} of {n} trajectories hit an infrastructure failure of "
        f"executor {breaker.name} ({', '.join(f'{k} x{c}' for k, c in sorted(kinds.items()))})"
    )
    if breaker.open:
        what += (
            f"; the circuit breaker opened after {breaker.threshold} consecutive failures "
            f"(executor.max_consecutive_failures) and refused {breaker.refused} node executions"
        )
    if frac < ctx.min_healthy_fraction:
        raise ExecutorOutageError(
            f"executor outage {where}: healthy fraction {frac:.3f} is below "
            f"executor.min_healthy_fraction {ctx.min_healthy_fraction:g}: {what}; nothing of "
            "this rollout was stored, re-run when the executor is back"
        )
    log.warning(
        "executor failures %s: healthy fraction %.3f: %s; unhealthy trajectories are left out",
        where,
        frac,
        what,
    )


def _force(d: dict, legal: list[str], action: str, charge: DecisionCharge) -> None:
    """Record a decision that was not sampled (or whose sample was discarded)."""
    d.update(legal=legal, action=action, chosen=legal.index(action), logp=0.0, forced=True)
    d.update(sampled_by="", h_rho=[], charge=charge)


def _finalize(d: dict, ep: Episode, reason: str, charge: DecisionCharge) -> None:
    """Put the episode into finalization and record its finalizing action as the decision."""
    ep.finalize(reason)
    fallback = ep.legal_actions()[0].to_json()
    _force(d, [fallback], fallback, charge)


def _choose(
    policy: Orchestrator,
    decisions: list[dict],
    plans: Sequence[EpisodePlan],
    episodes: Sequence[Episode],
    ctx: RolloutContext,
) -> None:
    """Fill ``action``/``chosen``/``logp``/``forced``/``charge`` for every decision of a round."""
    to_sample: dict[bool, list[dict]] = {True: [], False: []}
    for d in decisions:
        ep = episodes[d["i"]]
        if d["forced_action"] is not None or len(d["legal"]) == 1:
            _force(d, d["legal"], d["forced_action"] or d["legal"][0], DecisionCharge())
        elif policy.count_tokens(d["prompt"]) + policy.max_action_tokens > ep.ledger.tokens_left:
            _finalize(d, ep, "the budget cannot cover the next decision", DecisionCharge())
        else:
            to_sample[plans[d["i"]].uses_adapter].append(d)
    deadline = ctx.limits.decision_deadline_s
    for use_adapter, group in to_sample.items():
        if not group:
            continue
        gens = [
            torch_generator(ctx.run_seed, plans[d["i"]].seed_key(ctx.step), d["t"], "action")
            for d in group
        ]
        start = time.monotonic()
        samples = policy.sample(
            [d["prompt"] for d in group],
            [d["legal"] for d in group],
            gens,
            use_adapter=use_adapter,
            temperature=ctx.temperature,
            encode=not use_adapter,
        )
        elapsed = time.monotonic() - start
        for d, s in zip(group, samples, strict=True):
            clock = ctx.decision_clock
            seconds = elapsed if clock is None else clock(s.prompt_tokens, s.action_tokens)
            charge = DecisionCharge(s.prompt_tokens, s.action_tokens, seconds)
            if seconds > deadline:
                reason = f"the decision took {seconds:.2f} s, past its {deadline:g} s deadline"
                _finalize(d, episodes[d["i"]], reason, charge)
                d["timed_out"] = True
            else:
                d.update(action=d["legal"][s.index], chosen=s.index, logp=float(s.logp))
                d.update(forced=False, charge=charge, sampled_by="theta" if use_adapter else "rho")
                d["h_rho"] = [] if use_adapter else s.h


def _trajectory_row(plan: EpisodePlan, ep: Episode, step: int, timeouts: int) -> dict:
    exact, coarse = ep.graph.structure_keys(stopped=True)
    return {
        "traj_id": plan.traj_id,
        "step": step,
        "record_id": plan.record.record_id,
        "family": plan.record.family,
        "arm": plan.arm,
        "rollout_index": plan.rollout_index,
        "pair_skill": plan.pair_skill,
        "pair_kind": plan.pair_kind,
        "n_actions": len(ep.history),
        "reward": float(ep.reward if ep.reward is not None else 0.0),
        "healthy": ep.healthy,
        "complete": ep.stopped,
        "tokens": ep.ledger.tokens,
        "model_calls": ep.ledger.model_calls,
        "decision_timeouts": timeouts,
        "terminal_features": [float(x) for x in execution_features(ep)],
        "terminal_exact_key": exact,
        "terminal_coarse_key": coarse,
    }
