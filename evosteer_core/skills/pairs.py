"""Paired-rollout bookkeeping (docs/method.md §1.8): which pairs to roll out, and how outcomes count.

For each batch record whose family has a candidate, one pair: the candidate arm (forced first
action ADD_AGENT(n0, solver, σ)) and the control arm (ADD_AGENT(n0, solver), σ masked); the
rollout module runs both arms. Every ``reevaluation_every``-th step one extra pair tests a
validated skill. Outcomes count as wins, losses and ties of b± = 1[r(x±) ≥ 1/2] over
complete, side-effect-free pairs; the rest are counted as excluded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evosteer_core.episode.records import FAMILIES
from evosteer_core.skills.library import SkillLibrary

PAIR_KINDS: tuple[str, ...] = ("candidate", "reevaluation")
PASS_THRESHOLD = 0.5


def passes(reward: float) -> int:
    """b = 1[r ≥ 1/2]."""
    return int(reward >= PASS_THRESHOLD)


@dataclass(frozen=True)
class PairPlan:
    """One pair to roll out: the record, its family, the skill under test and why."""

    record_id: str
    family: str
    skill_id: str
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in PAIR_KINDS:
            raise ValueError(f"PairPlan {self.record_id}: kind {self.kind!r} not in {PAIR_KINDS}")


@dataclass(frozen=True)
class PairOutcome:
    """The result of one pair. ``complete`` and ``side_effect_free`` must hold for both arms;
    rewards are None for an arm that did not finish."""

    record_id: str
    family: str
    skill_id: str
    kind: str
    reward_plus: float | None
    reward_minus: float | None
    complete: bool = True
    side_effect_free: bool = True

    @property
    def usable(self) -> bool:
        """Counted in W/L/T0: both arms complete, side-effect-free and scored."""
        return (
            self.complete
            and self.side_effect_free
            and self.reward_plus is not None
            and self.reward_minus is not None
        )

    @property
    def sign(self) -> int:
        """b+ − b− ∈ {−1, 0, 1}; only defined for a usable pair."""
        if not self.usable:
            raise ValueError(f"pair {self.record_id}/{self.skill_id} is not usable")
        assert self.reward_plus is not None and self.reward_minus is not None
        return passes(self.reward_plus) - passes(self.reward_minus)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PairCounts:
    """Wins, losses and ties over usable pairs, plus how many pairs were excluded."""

    wins: int = 0
    losses: int = 0
    ties: int = 0
    excluded: int = 0

    @property
    def discordant(self) -> int:
        """D = W + L."""
        return self.wins + self.losses

    @property
    def observations(self) -> int:
        """N = W + L + T0 (usable pairs)."""
        return self.wins + self.losses + self.ties

    def __add__(self, other: PairCounts) -> PairCounts:
        return PairCounts(
            self.wins + other.wins,
            self.losses + other.losses,
            self.ties + other.ties,
            self.excluded + other.excluded,
        )


def tally(outcomes: Iterable[PairOutcome]) -> dict[str, PairCounts]:
    """Per skill id: W, L, T0 over usable pairs and the number of excluded pairs."""
    counts: dict[str, PairCounts] = {}
    for pair in outcomes:
        if not pair.usable:
            delta = PairCounts(excluded=1)
        else:
            s = pair.sign
            delta = PairCounts(wins=int(s > 0), losses=int(s < 0), ties=int(s == 0))
        counts[pair.skill_id] = counts.get(pair.skill_id, PairCounts()) + delta
    return counts


def candidate_for_family(
    library: SkillLibrary, family: str, observations: Mapping[str, int]
) -> str | None:
    """The family's candidate with the fewest paired observations (ties: admission order)."""
    candidates = library.family_entries(family, "candidate")
    if not candidates:
        return None
    return min(candidates, key=lambda e: observations.get(e.skill_id, 0)).skill_id


def reevaluation_skill(library: SkillLibrary, step: int, every: int = 10) -> str | None:
    """Which validated skill gets the re-evaluation pair at ``step`` (None if none).

    Only steps that are multiples of ``every`` have one. The validated skills are ordered by
    (family index in FAMILIES, admission order) and the r-th re-evaluation step (r = step //
    every) takes skill number (r − 1) mod n: a round-robin that depends only on the step and
    the library, never on outcomes.
    """
    if every <= 0:
        raise ValueError(f"reevaluation_every must be positive, got {every}")
    if step <= 0 or step % every:
        return None
    ordered = [e for family in FAMILIES for e in library.family_entries(family, "validated")]
    if not ordered:
        return None
    return ordered[(step // every - 1) % len(ordered)].skill_id


def plan_pairs(
    batch: Sequence[tuple[str, str]],
    library: SkillLibrary,
    observations: Mapping[str, int],
    step: int,
    reevaluation_every: int | None = 10,
) -> tuple[PairPlan, ...]:
    """The pairs to roll out for a batch of (record_id, family) items, in batch order.

    Every record whose family has a candidate gets a candidate pair; at re-evaluation steps the
    first batch record of the chosen validated skill's family also gets a re-evaluation pair
    (never with ``reevaluation_every`` None: fixed-count admission re-tests nothing).
    """
    plans: list[PairPlan] = []
    for record_id, family in batch:
        skill_id = candidate_for_family(library, family, observations)
        if skill_id is not None:
            plans.append(PairPlan(record_id, family, skill_id, "candidate"))
    reeval = (
        None
        if reevaluation_every is None
        else reevaluation_skill(library, step, reevaluation_every)
    )
    if reeval is not None:
        family = library.get(reeval).skill.family
        record = next((rid for rid, fam in batch if fam == family), None)
        if record is not None:
            plans.append(PairPlan(record, family, reeval, "reevaluation"))
    return tuple(plans)
