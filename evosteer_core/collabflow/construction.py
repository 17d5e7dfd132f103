"""The construction episode: the director builds a team from ``Team()`` until stop or abort
(docs/collabflow.md §1).

Construction and execution have separate budgets. B_con (``collabflow.construction_tokens``)
pays for the director's scoring passes — each decision is charged its prompt and every legal
string it scores — and B_exec = ``budget.total_tokens`` − B_con is what the team's execution
gets (:func:`execution_limits`); construction can never spend past B_con, so it never takes
from execution. A decision is charged before it runs: when its tokens do not fit in what is
left of B_con, or it runs past ``budget.decision_deadline_s``, or the construction past
``budget.wall_time_s``, the construction aborts (†) with the reason, and an aborted
construction is recorded as such and never trained on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from evosteer_core.collabflow.director import (
    DirectorView,
    director_prompt,
    legal_logprobs,
    sample_index,
    scoring_tokens,
)
from evosteer_core.collabflow.team import STOP, BuildAction, Team, TeamSpec, apply, legal_actions
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.roles import Catalogue
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.seeding import torch_generator
from evosteer_core.policy.backbone import Policy


@dataclass(frozen=True)
class ConstructionBudget:
    """What one construction may spend: B_con tokens, seconds per decision, seconds in all."""

    tokens: int
    deadline_s: float
    wall_s: float

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.deadline_s <= 0 or self.wall_s <= 0:
            raise ValueError(f"construction budget must be non-negative and timed: {self}")


def construction_budget(cfg: RunConfig) -> ConstructionBudget:
    """B_con from ``collabflow.construction_tokens``, the time limits from ``budget``."""
    if cfg.collabflow is None:
        raise ValueError("construction_budget: method collabflow has no collabflow section")
    return ConstructionBudget(
        tokens=cfg.collabflow.construction_tokens,
        deadline_s=cfg.budget.decision_deadline_s,
        wall_s=cfg.budget.wall_time_s,
    )


def execution_limits(cfg: RunConfig) -> BudgetLimits:
    """The execution's limits: the episode's ``budget`` with B_exec = B_total − B_con tokens."""
    if cfg.collabflow is None:
        raise ValueError("execution_limits: method collabflow has no collabflow section")
    b_exec = cfg.budget.total_tokens - cfg.collabflow.construction_tokens
    return replace(cfg.budget, total_tokens=b_exec)


@dataclass
class ConstructionLedger:
    """Tokens and seconds a construction has spent; a charge past B_con is refused."""

    budget: ConstructionBudget
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_left(self) -> int:
        return self.budget.tokens - self.tokens

    def affords(self, tokens: int) -> bool:
        return tokens <= self.tokens_left

    def charge(self, tokens: int, seconds: float) -> None:
        if not self.affords(tokens):
            raise ValueError(f"a charge of {tokens} tokens exceeds the {self.tokens_left} left")
        self.tokens += tokens
        self.seconds += seconds


@dataclass(frozen=True)
class ConstructionStep:
    """One accepted decision: what the director saw and scored, what it chose, and the
    collecting director's legal-set log-probabilities (the KL term and π_ref read them)."""

    t: int
    prompt: str
    legal: tuple[str, ...]
    index: int
    logp: float
    """log p_F(u_t | v_{t−1}) = ``legal_logp[index]`` under the collecting director."""
    legal_logp: tuple[float, ...]
    tokens: int
    """Scoring tokens charged (0 for a single legal action, which is not scored)."""
    seconds: float

    @property
    def action(self) -> BuildAction:
        return BuildAction.parse(self.legal[self.index])


@dataclass(frozen=True)
class Construction:
    """A construction episode: its accepted steps, and the team (None when aborted, †)."""

    steps: tuple[ConstructionStep, ...]
    team: Team | None
    abort_reason: str | None = None
    tokens: int = 0
    seconds: float = 0.0
    actions: tuple[BuildAction, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "actions", tuple(s.action for s in self.steps))

    @property
    def aborted(self) -> bool:
        return self.team is None


def construct(
    policy: Policy,
    spec: TeamSpec,
    catalogue: Catalogue,
    task: str,
    budget: ConstructionBudget,
    *,
    use_adapter: bool,
    seed_parts: tuple[object, ...],
    renderer: str = "compact",
    decision_clock: Callable[[int, int], float] | None = None,
    uniform: bool = False,
) -> Construction:
    """Build a team for ``task`` (its orchestrator text) from ``Team()``: at each state score
    the legal set (θ when ``use_adapter``, else ρ), charge the decision, sample with a
    generator derived from ``seed_parts``, apply; until ``stop`` or an abort.

    ``decision_clock(tokens_in, tokens_out)`` gives a decision's seconds (the sim's simulated
    clock, so sim runs are deterministic); None: the measured time of its scoring pass.
    ``uniform``: the random legal graph (``collabflow.construction: uniform``,
    docs/collabflow.md §5): every decision is uniform over the legal set and scores nothing,
    so it costs no construction tokens."""
    ledger = ConstructionLedger(budget)
    generator = torch_generator(*seed_parts, "construct")
    team, steps = Team(), []

    def result(team_out: Team | None, reason: str | None = None) -> Construction:
        return Construction(tuple(steps), team_out, reason, ledger.tokens, ledger.seconds)

    while True:
        legal = legal_actions(team, spec)
        if not legal:
            return result(None, "no construction action is legal")
        texts = tuple(a.text() for a in legal)
        view = DirectorView(
            spec.family, task, spec, team, tuple(s.action for s in steps), ledger.tokens_left
        )
        prompt = director_prompt(view, catalogue, renderer)
        scored = len(texts) > 1 and not uniform
        cost = scoring_tokens(policy, prompt, texts) if scored else 0
        if not ledger.affords(cost):
            return result(
                None, f"the next decision needs {cost} tokens, {ledger.tokens_left} of B_con left"
            )
        started = time.perf_counter()
        if scored:
            logp = legal_logprobs(policy, prompt, texts, use_adapter)
        else:
            logp = torch.full((len(texts),), -math.log(len(texts)), dtype=torch.float64)
        lp = tuple(float(x) for x in logp.double().cpu())
        measured = time.perf_counter() - started
        seconds = 0.0 if cost == 0 else (decision_clock(cost, 0) if decision_clock else measured)
        ledger.charge(cost, seconds)
        if seconds > budget.deadline_s:
            return result(
                None, f"a decision took {seconds:.2f} s, past its {budget.deadline_s:g} s"
            )
        if ledger.seconds > budget.wall_s:
            return result(
                None, f"construction took {ledger.seconds:.2f} s, past {budget.wall_s:g} s"
            )
        index = 0 if len(texts) == 1 else sample_index(logp, generator)
        steps.append(
            ConstructionStep(len(steps), prompt, texts, index, lp[index], lp, cost, seconds)
        )
        if legal[index] == STOP:
            return result(team)
        team = apply(team, legal[index], spec)
