"""The skill lifecycle of a run and the libraries of the admission-gain comparison (docs/method.md §1.10).

``lifecycle_rows`` joins a :class:`SkillLibrary` with its :class:`TestLedger`: for every skill
ever admitted, the step it was proposed, promoted and retired, its final status, its pair
counts W/L/T over all its comparisons (superseded ones included) and Δ̂ = (W−L)/(W+L+T0).
``validated_only`` and ``admit_all`` build the two libraries the admission gain compares: the
validated skills the tests admitted, against every proposed skill admitted as if validated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from evosteer_core.episode.records import FAMILIES
from evosteer_core.skills.library import LibraryLimits, SkillLibrary
from evosteer_core.skills.sequential import TestLedger, effect


@dataclass(frozen=True)
class LifecycleRow:
    """One skill's history: steps of its status changes (None = never) and its pair counts."""

    skill_id: str
    name: str
    family: str
    proposed_step: int
    validated_step: int | None
    retired_step: int | None
    status: str
    wins: int
    losses: int
    ties: int

    @property
    def effect(self) -> float | None:
        """Δ̂ = (W − L)/(W + L + T0); None without any usable pair."""
        return effect(self.wins, self.losses, self.ties)


def _decision_step(ledger: TestLedger, skill_id: str, decision: str) -> int | None:
    """Step of the look that took ``decision`` for ``skill_id`` (None if none did)."""
    return next(
        (r.step for r in ledger.records if r.skill_id == skill_id and r.decision == decision), None
    )


def lifecycle_rows(library: SkillLibrary, ledger: TestLedger) -> list[LifecycleRow]:
    """One row per library entry, in admission order.

    Promotion and retirement steps come from the ledger's look decisions; a status the ledger
    cannot explain (e.g. "validated" without a "promote" look) raises ``ValueError``.
    """
    rows = []
    for entry in library.entries:
        sid = entry.skill_id
        validated = _decision_step(ledger, sid, "promote")
        retired = _decision_step(ledger, sid, "retire")
        was_validated = entry.status == "validated" or (
            entry.status == "retired" and validated is not None
        )
        if was_validated and validated is None:
            raise ValueError(
                f"skill {entry.skill.name!r} ({sid}) is {entry.status} but the "
                "ledger holds no promote decision for it"
            )
        if (entry.status == "retired") != (retired is not None):
            raise ValueError(
                f"skill {entry.skill.name!r} ({sid}) has status {entry.status!r} but "
                f"the ledger's retire decision step is {retired}"
            )
        comps = [c for c in ledger.comparisons if c.skill_id == sid]
        rows.append(
            LifecycleRow(
                skill_id=sid,
                name=entry.skill.name,
                family=entry.skill.family,
                proposed_step=entry.added_step,
                validated_step=validated,
                retired_step=retired,
                status=entry.status,
                wins=sum(c.counts.wins for c in comps),
                losses=sum(c.counts.losses for c in comps),
                ties=sum(c.counts.ties for c in comps),
            )
        )
    return rows


def format_lifecycle(
    rows: list[LifecycleRow], hidden_effect: Callable[[str, str], float] | None = None
) -> str:
    """A fixed-width table of ``rows``; ``hidden_effect(name, family)`` adds a ground-truth
    column (the SIMULATED latent effect in the sim suite)."""

    def step(x: int | None) -> str:
        return "-" if x is None else str(x)

    head = (
        f"{'family':<10} {'skill':<28} {'id':<14} {'prop':>4} {'valid':>5} {'retir':>5} "
        f"{'status':<9} {'W':>3} {'L':>3} {'T':>3} {'Δ̂':>6}"
    )
    if hidden_effect is not None:
        head += f" {'SIM effect':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        eff = "n/a" if r.effect is None else f"{r.effect:+.3f}"
        line = (
            f"{r.family:<10} {r.name[:28]:<28} {r.skill_id[9:21]:<14} {r.proposed_step:>4} "
            f"{step(r.validated_step):>5} {step(r.retired_step):>5} {r.status:<9} "
            f"{r.wins:>3} {r.losses:>3} {r.ties:>3} {eff:>6}"
        )
        if hidden_effect is not None:
            line += f" {hidden_effect(r.name, r.family):>+10.2f}"
        lines.append(line)
    return "\n".join(lines)


def validated_only(library: SkillLibrary) -> SkillLibrary:
    """The library without candidates or retired skills: what validated admission deploys."""
    entries = tuple(e for e in library.entries if e.status == "validated")
    return replace(library, entries=entries)


def admit_all(library: SkillLibrary) -> SkillLibrary:
    """Every skill ever proposed, marked validated as if each had been admitted untested.

    The per-family validated limit is raised to the largest family count, so the library is
    consistent (its menus then hold every proposed skill of the family, in admission order).
    """
    entries = tuple(replace(e, status="validated") for e in library.entries)
    most = max((sum(e.skill.family == f for e in entries) for f in FAMILIES), default=0)
    limits = LibraryLimits(
        max_total=library.limits.max_total,
        max_per_family=library.limits.max_per_family,
        max_validated_per_family=max(most, library.limits.max_validated_per_family),
        max_candidates_per_family=library.limits.max_candidates_per_family,
    )
    return replace(library, entries=entries, limits=limits)
