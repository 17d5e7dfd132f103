"""CollabFlow evaluation episodes (docs/collabflow.md §5): per held-out task, the run's team —
the director's construction (θ or ρ; uniform over the legal set for the random legal graph) or
the fixed team of ``collabflow.fixed_team`` — executed with the execution budget, scored with
the official reward. Frozen: nothing is trained and no counter moves. ``fixed_team: best``
picks each family's team on the training tasks first (:func:`fixed_teams`).

Seeds: run k of an evaluation tag has the run seed of every row of that tag, and each task
the episode key ``eval/<record id>``, so a construction draws from (run seed, key) and every
executor call of agent a from (run seed, key, a, call index): two rows that run the same agent
on the same task share its draws (common random numbers, as EvoSteer's rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from evosteer_core.collabflow.baselines import BASELINES, BEST, baseline_team
from evosteer_core.collabflow.construction import (
    Construction,
    construct,
    construction_budget,
    execution_limits,
)
from evosteer_core.collabflow.context import task_spec
from evosteer_core.collabflow.execution import TeamOutcome, execute_team
from evosteer_core.collabflow.team import Team
from evosteer_core.episode.budget import BudgetLedger
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.rollout import RolloutContext
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.training.session import Session


@dataclass(frozen=True)
class TeamEpisode:
    """One task's evaluation episode: the construction (None for a fixed team), the team (None
    when the construction aborted, †) and its execution (None after an abort)."""

    record: TaskRecord
    construction: Construction | None
    team: Team | None
    outcome: TeamOutcome | None

    @property
    def reward(self) -> float:
        """The official reward; an aborted construction answers nothing and scores 0."""
        return 0.0 if self.outcome is None else self.outcome.reward

    @property
    def construction_tokens(self) -> int:
        return 0 if self.construction is None else self.construction.tokens


def episode_key(record: TaskRecord) -> str:
    """The key of every draw of a task's evaluation episode (the same in every row)."""
    return f"eval/{record.record_id}"


SELECTION_TAG = "fixed-team-selection"
"""The run-seed tag of the fixed team's selection run on the training tasks."""


def fixed_teams(s: Session) -> dict[str, str]:
    """Family → the named team every task of that family runs (empty: the director builds).

    ``collabflow.fixed_team: best`` is the paper's fixed-team control: per family, the baseline
    with the highest mean official reward on the run's *training* tasks (one run, seeded by
    ``train.seed`` and :data:`SELECTION_TAG`; ties go to the earlier team of
    :data:`~evosteer_core.collabflow.baselines.BASELINES`); no held-out task is looked at."""
    collab = s.cfg.collabflow
    if collab is None or collab.fixed_team is None:
        return {}
    families = sorted({r.family for r in (*s.world.train_records, *s.world.heldout_records)})
    if collab.fixed_team != BEST:
        return dict.fromkeys(families, collab.fixed_team)
    ctx = s.rollout_context(derive_seed(s.cfg.train.seed, SELECTION_TAG), 0, evaluation=True)
    score: dict[tuple[str, str], list[float]] = {}
    for name in BASELINES:
        for record in s.world.train_records:
            ep = team_episode(s, ctx, record, False, name)
            score.setdefault((record.family, name), []).append(ep.reward)
    return {
        f: max(
            BASELINES, key=lambda n: (fmean(score.get((f, n), [0.0])), -list(BASELINES).index(n))
        )
        for f in families
    }


def team_episode(
    s: Session,
    ctx: RolloutContext,
    record: TaskRecord,
    use_adapter: bool,
    fixed: str | None = None,
) -> TeamEpisode:
    """Build the task's team — the named team ``fixed``, or a construction by θ when
    ``use_adapter`` else ρ — and execute it under ``ctx`` (its run seed, executor, official
    evaluator and decision clock)."""
    cfg = s.cfg
    collab = cfg.collabflow
    if collab is None:
        raise ValueError("a CollabFlow evaluation needs method: collabflow")
    menu = ctx.menus.get(record.family, ())
    spec = task_spec(collab, record.family, ctx.catalogue, [v.skill_id for v in menu])
    key = episode_key(record)
    construction = None
    if fixed is not None:
        team: Team | None = baseline_team(fixed, spec)
    else:
        construction = construct(
            s.policy.policy,
            spec,
            ctx.catalogue,
            record.orchestrator_text,
            construction_budget(cfg),
            use_adapter=use_adapter,
            seed_parts=(ctx.run_seed, key),
            renderer=cfg.policy.renderer,
            decision_clock=ctx.decision_clock,
            uniform=collab.construction == "uniform",
        )
        team = construction.team
    if team is None:
        return TeamEpisode(record, construction, None, None)
    outcome = execute_team(
        team,
        spec,
        record,
        ctx.executor,
        BudgetLedger(execution_limits(cfg)),
        (ctx.run_seed, key),
        collab,
        catalogue=ctx.catalogue,
        skills={v.skill_id: v for v in menu},
        evaluator=ctx.evaluator,
    )
    return TeamEpisode(record, construction, team, outcome)
