"""The CollabFlow episode and its rollout tables (docs/collabflow.md §1, §4).

An episode constructs a team with the director (``construction.construct``, under B_con) and,
unless the construction aborted, runs it with the frozen executor
(``execution.execute_team``, under B_exec), whose output the benchmark's reward scores
(r_ans). A batch of episodes becomes two tables: one row per trajectory (the team, its
canonical hash and task cluster, the abort flag, r_ans, tokens) and one row per construction
decision (the prompt, the legal strings, the choice and the collecting director's
legal-set log-probabilities), validated by :data:`COLLAB_TRAJECTORIES` and
:data:`COLLAB_DECISIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pandera.pandas as pa

from evosteer_core.collabflow.construction import (
    Construction,
    construct,
    construction_budget,
    execution_limits,
)
from evosteer_core.collabflow.context import task_spec
from evosteer_core.collabflow.execution import TeamOutcome, execute_team
from evosteer_core.collabflow.team import TeamSpec
from evosteer_core.episode.actions import canonical_json
from evosteer_core.episode.budget import BudgetLedger, TokenUsage
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import Catalogue
from evosteer_core.episode.runtime import Evaluator
from evosteer_core.executors.base import Executor
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.schemas import (
    CHOICE_CHECKS,
    DECISION_COLUMNS,
    log_prob,
    trajectory_head,
)
from evosteer_core.policy.backbone import Policy

ARMS: tuple[str, ...] = ("theta", "rho")
"""The director with its adapter (θ, trained) and without it (ρ, the untrained director)."""


@dataclass(frozen=True)
class CollabPlan:
    """One trajectory to collect: a record, the director's arm, the rollout's index."""

    record: TaskRecord
    arm: str
    rollout_index: int
    evaluation: bool = False
    """Evaluation episodes of θ and ρ share their seeds (a paired comparison)."""

    @property
    def traj_id(self) -> str:
        return f"{self.record.record_id}/{self.arm}/{self.rollout_index}"

    def seed_key(self, step: int) -> str:
        """The key of every draw of the episode (the director's and the executor's)."""
        arm = "eval" if self.evaluation else self.arm
        return f"s{step}/{self.record.record_id}/{arm}/{self.rollout_index}"


@dataclass(frozen=True)
class CollabContext:
    """What a batch of episodes shares: the run config, the role catalogue, the executor, the
    reward, the run seed and step, and the decision clock (the sim's; None: measured)."""

    cfg: RunConfig
    catalogue: Catalogue
    executor: Executor
    evaluator: Evaluator
    run_seed: int
    step: int
    decision_clock: Callable[[int, int], float] | None = None


@dataclass(frozen=True)
class CollabEpisode:
    """A finished episode: its plan, the spec it was built under, the construction and the
    execution's outcome (None when the construction aborted)."""

    plan: CollabPlan
    spec: TeamSpec
    construction: Construction
    outcome: TeamOutcome | None

    @property
    def r_ans(self) -> float:
        """The answer score (0 for an aborted construction: there is no answer)."""
        return 0.0 if self.outcome is None else float(self.outcome.reward)


def spec_for(record: TaskRecord, ctx: CollabContext) -> TeamSpec:
    """The construction space of ``record`` (``context.task_spec``; no skills offered)."""
    assert ctx.cfg.collabflow is not None  # method collabflow
    return task_spec(ctx.cfg.collabflow, record.family, ctx.catalogue)


def run_episode(policy: Policy, plan: CollabPlan, ctx: CollabContext) -> CollabEpisode:
    """Construct (θ for the ``theta`` arm, ρ for ``rho``), then execute the team under B_exec."""
    cfg, record = ctx.cfg, plan.record
    assert cfg.collabflow is not None  # method collabflow
    spec, key = spec_for(record, ctx), plan.seed_key(ctx.step)
    built = construct(
        policy,
        spec,
        ctx.catalogue,
        record.orchestrator_text,
        construction_budget(cfg),
        use_adapter=plan.arm == "theta",
        seed_parts=(ctx.run_seed, key),
        renderer=cfg.policy.renderer,
        decision_clock=ctx.decision_clock,
    )
    if built.team is None:
        return CollabEpisode(plan, spec, built, None)
    outcome = execute_team(
        built.team,
        spec,
        record,
        ctx.executor,
        BudgetLedger(execution_limits(cfg)),
        (ctx.run_seed, key),
        cfg.collabflow,
        catalogue=ctx.catalogue,
        evaluator=ctx.evaluator,
    )
    return CollabEpisode(plan, spec, built, outcome)


def run_episodes(
    policy: Policy, plans: Sequence[CollabPlan], ctx: CollabContext
) -> list[CollabEpisode]:
    """The plans' episodes, one after another in plan order (each keyed by its own seed)."""
    return [run_episode(policy, plan, ctx) for plan in plans]


def episode_usage(episodes: Sequence[CollabEpisode]) -> TokenUsage:
    """Tokens the episodes used as billed: the director's scoring (prompt) tokens and the
    executor's calls."""
    usage = TokenUsage()
    for ep in episodes:
        usage.orchestrator_prompt += ep.construction.tokens
        if ep.outcome is not None:
            usage.add(ep.outcome.ledger.usage)
    return usage


def _trajectory_row(ep: CollabEpisode, step: int) -> dict:
    team, out = ep.construction.team, ep.outcome
    calls = () if out is None else out.calls
    ledger = None if out is None else out.ledger
    exec_tokens = 0 if ledger is None else ledger.tokens
    return {
        "traj_id": ep.plan.traj_id,
        "step": step,
        "record_id": ep.plan.record.record_id,
        "family": ep.plan.record.family,
        "arm": ep.plan.arm,
        "rollout_index": ep.plan.rollout_index,
        "seed_key": ep.plan.seed_key(step),
        "aborted": team is None,
        "abort_reason": ep.construction.abort_reason or "",
        "team_hash": "" if team is None else team.team_hash(),
        "team": "" if team is None else canonical_json(team.canonical()),
        "n_actions": len(ep.construction.steps),
        "r_ans": ep.r_ans,
        "healthy": not any(c.status == "infra_failure" for c in calls),
        "construction_tokens": ep.construction.tokens,
        "execution_tokens": exec_tokens,
        "tokens": ep.construction.tokens + exec_tokens,
        "gates": 0 if out is None else len(out.gates),
        "stopped": "" if out is None or out.stopped is None else out.stopped,
    }


def rollout_tables(
    episodes: Sequence[CollabEpisode], step: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(trajectories, decisions) of a batch of episodes, validated."""
    traj = pd.DataFrame([_trajectory_row(ep, step) for ep in episodes], columns=TRAJ_COLUMNS)
    dec = pd.DataFrame(
        [
            {
                "traj_id": ep.plan.traj_id,
                "t": s.t,
                "prompt": s.prompt,
                "legal": list(s.legal),
                "chosen": s.index,
                "action": s.legal[s.index],
                "logp": s.logp,
                "legal_logp": list(s.legal_logp),
                "tokens": s.tokens,
                "seconds": s.seconds,
            }
            for ep in episodes
            for s in ep.construction.steps
        ],
        columns=DEC_COLUMNS,
    )
    if dec.empty:  # every construction aborted before its first decision: typed, no rows
        dec = dec.astype(EMPTY_DECISION_DTYPES)
    validate_collab_tables(traj, dec)
    return traj, dec


def _sums_to_one(values: object) -> bool:
    p = np.exp(np.asarray(values, dtype=np.float64))
    return bool(len(p) > 0 and np.isfinite(p).all() and abs(p.sum() - 1.0) < 1e-4)


COLLAB_TRAJECTORIES = pa.DataFrameSchema(
    {
        **trajectory_head(ARMS),
        "seed_key": pa.Column(str),
        "aborted": pa.Column(bool),
        "abort_reason": pa.Column(str),
        "team_hash": pa.Column(str),
        "team": pa.Column(str),
        "n_actions": pa.Column(int, pa.Check.ge(0)),
        "r_ans": pa.Column(float, pa.Check.in_range(0.0, 1.0)),
        "healthy": pa.Column(bool),
        "construction_tokens": pa.Column(int, pa.Check.ge(0)),
        "execution_tokens": pa.Column(int, pa.Check.ge(0)),
        "tokens": pa.Column(int, pa.Check.ge(0)),
        "gates": pa.Column(int, pa.Check.ge(0)),
        "stopped": pa.Column(str),
    },
    checks=[
        pa.Check(
            lambda df: df["aborted"] == (df["team_hash"] == ""),
            error="a team hash exactly when the construction did not abort",
        ),
        pa.Check(
            lambda df: df["aborted"] == (df["abort_reason"] != ""),
            error="an abort reason exactly when aborted",
        ),
        pa.Check(
            lambda df: df["tokens"] == df["construction_tokens"] + df["execution_tokens"],
            error="tokens = construction + execution tokens",
        ),
    ],
    strict=True,
    coerce=False,
    name="collabflow_trajectories",
)

COLLAB_DECISIONS = pa.DataFrameSchema(
    {
        **DECISION_COLUMNS,
        "logp": pa.Column(float, log_prob(1e-6)),
        "legal_logp": pa.Column(
            object, pa.Check(lambda s: s.map(_sums_to_one), error="a legal-set distribution")
        ),
        "tokens": pa.Column(int, pa.Check.ge(0)),
        "seconds": pa.Column(float, pa.Check.ge(0.0)),
    },
    checks=[
        *CHOICE_CHECKS,
        pa.Check(
            lambda df: df.apply(lambda r: len(r["legal"]) == len(r["legal_logp"]), axis=1),
            error="one log-prob per legal string",
        ),
        pa.Check(
            lambda df: df.apply(lambda r: r["legal_logp"][r["chosen"]] == r["logp"], axis=1),
            error="logp equals legal_logp[chosen]",
        ),
    ],
    strict=True,
    coerce=False,
    name="collabflow_decisions",
)

EMPTY_DECISION_DTYPES = {
    "traj_id": "str",
    "t": "int64",
    "prompt": "str",
    "chosen": "int64",
    "action": "str",
    "logp": "float64",
    "tokens": "int64",
    "seconds": "float64",
}
TRAJ_COLUMNS = list(COLLAB_TRAJECTORIES.columns)
DEC_COLUMNS = list(COLLAB_DECISIONS.columns)


def validate_collab_tables(trajectories: pd.DataFrame, decisions: pd.DataFrame) -> None:
    """Validate both tables (lazy) and that every decision belongs to a trajectory whose
    ``n_actions`` counts it."""
    COLLAB_TRAJECTORIES.validate(trajectories, lazy=True)
    COLLAB_DECISIONS.validate(decisions, lazy=True)
    counts = decisions.groupby("traj_id").size()
    expected = trajectories.set_index("traj_id")["n_actions"]
    unknown = set(counts.index) - set(expected.index)
    if unknown:
        raise ValueError(f"decisions reference unknown trajectories: {sorted(unknown)[:5]}")
    wrong = [t for t, n in expected.items() if int(counts.get(t, 0)) != int(n)]
    if wrong:
        raise ValueError(f"trajectories whose n_actions is not their decision count: {wrong[:5]}")
