"""One validation round (docs/method.md §1.8, Alg. 1 step 8) as a pure function.

Order within a round, for the library snapshot the batch was rolled out with:
1. count this batch's pairs into each skill's open comparison, registering a new comparison
   (next global j) when the skill has none open or its context changed;
2. take one look for every open comparison with new discordant pairs (in j order) and apply
   promotions and retirements to the library;
3. run the author window(s) on the updated library and admit what passes the filters;
4. close as superseded every open comparison whose context (reference or background menu)
   the changes of steps 2–3 altered; its skill's next pairs open a new registration.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from evosteer_core.episode.records import FAMILIES
from evosteer_core.skills.author import (
    Author,
    AuthorError,
    family_stats,
    library_view,
    select_evidence,
    window_families,
)
from evosteer_core.skills.filters import Rejection, StyleLimits
from evosteer_core.skills.library import LibraryDiff, SkillLibrary, diff
from evosteer_core.skills.pairs import PairCounts, PairOutcome, passes, tally
from evosteer_core.skills.sequential import TestLedger
from evosteer_core.skills.skill import Skill, canonical_json


@dataclass(frozen=True)
class RoundConfig:
    """Settings of a validation round (Table 3 values by default)."""

    warmup_steps: int = 8
    max_evidence: int = 12
    min_leak_chars: int = 32
    style: StyleLimits = field(default_factory=StyleLimits)


@dataclass(frozen=True)
class WindowOutcome:
    """One author window: the family, what happened and the admitted id or the rejection."""

    family: str
    result: str  # "admitted" | "declined" | "rejected"
    skill_id: str | None = None
    rejection: Rejection | None = None

    def to_dict(self) -> dict[str, Any]:
        rej = (
            None
            if self.rejection is None
            else {"code": self.rejection.code, "message": self.rejection.message}
        )
        return {
            "family": self.family,
            "result": self.result,
            "skill_id": self.skill_id,
            "rejection": rej,
        }


@dataclass(frozen=True)
class RoundReport:
    """What a round did: pair counts, registrations, look decisions, supersessions, windows."""

    step: int
    pair_counts: dict[str, PairCounts]
    registered: tuple[int, ...]
    decisions: tuple[tuple[int, str, str], ...]
    superseded: tuple[int, ...]
    windows: tuple[WindowOutcome, ...]
    library_diff: LibraryDiff
    alpha_spent: float
    library_version: int
    library_hash: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "pair_counts": {k: dict(v.__dict__) for k, v in sorted(self.pair_counts.items())},
            "registered": list(self.registered),
            "decisions": [list(d) for d in self.decisions],
            "superseded": list(self.superseded),
            "windows": [w.to_dict() for w in self.windows],
            "library_diff": self.library_diff.to_dict(),
            "alpha_spent": self.alpha_spent,
            "library_version": self.library_version,
            "library_hash": self.library_hash,
        }


def context_key(library: SkillLibrary, skill_id: str, reference_id: str) -> str:
    """Fingerprint of a comparison's fixed context: the reference and the background menu
    (every other selectable skill of the family, with its status)."""
    family = library.get(skill_id).skill.family
    background = sorted(
        (e.skill_id, e.status) for e in library.menu_entries(family) if e.skill_id != skill_id
    )
    text = canonical_json({"reference": reference_id, "skill": skill_id, "background": background})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _skill_order(library: SkillLibrary, skill_ids: Iterable[str]) -> list[str]:
    """Deterministic order: family index, then admission order (never outcome-dependent)."""
    position = {e.skill_id: i for i, e in enumerate(library.entries)}
    return sorted(
        skill_ids, key=lambda s: (FAMILIES.index(library.get(s).skill.family), position[s])
    )


def _record_pairs(
    library: SkillLibrary,
    ledger: TestLedger,
    counts: dict[str, PairCounts],
    step: int,
    reference_id: str,
) -> tuple[TestLedger, list[int], list[int]]:
    registered: list[int] = []
    superseded: list[int] = []
    for skill_id in _skill_order(library, counts):
        entry = library.get(skill_id)
        if entry.status == "retired":
            raise ValueError(
                f"step {step}: pair outcomes for retired skill {skill_id}; pairs must be planned "
                f"from the library snapshot passed to validation_round"
            )
        context = context_key(library, skill_id, reference_id)
        comp = ledger.open_comparison(skill_id)
        if comp is not None and comp.context != context:
            ledger = ledger.close(comp.j, "superseded", step)
            superseded.append(comp.j)
            comp = None
        if comp is None:
            kind = "candidate" if entry.status == "candidate" else "reevaluation"
            ledger, j = ledger.register(skill_id, entry.skill.family, kind, context, step)
            registered.append(j)
        else:
            j = comp.j
        ledger = ledger.add_pairs(j, counts[skill_id])
    return ledger, registered, superseded


def _take_looks(
    library: SkillLibrary, ledger: TestLedger, step: int
) -> tuple[SkillLibrary, TestLedger, list[tuple[int, str, str]]]:
    decisions: list[tuple[int, str, str]] = []
    for comp in ledger.open_comparisons():
        if not comp.has_new_evidence:
            continue
        entry = library.get(comp.skill_id)
        family = entry.skill.family
        full = library.count(family, "validated") >= library.limits.max_validated_per_family
        ledger, decision = ledger.take_look(comp.j, step, entry.status, full)
        decisions.append((comp.j, comp.skill_id, decision))
        if decision == "promote":
            library = library.transition(comp.skill_id, "validated", step)
        elif decision == "retire":
            library = library.transition(comp.skill_id, "retired", step)
    return library, ledger, decisions


def _run_windows(
    library: SkillLibrary,
    author: Author,
    evidence_pool: Sequence[Any],
    source_prompts: Sequence[str],
    step: int,
    config: RoundConfig,
) -> tuple[SkillLibrary, list[WindowOutcome]]:
    outcomes: list[WindowOutcome] = []
    prompts = [*source_prompts, *(t.prompt for t in evidence_pool)]
    for family in window_families(step, library, evidence_pool, config.warmup_steps):
        stats = family_stats(family, library, evidence_pool)
        evidence = select_evidence(evidence_pool, family, config.max_evidence)
        proposal = author.propose(family, library_view(library), stats, evidence, step)
        if isinstance(proposal, AuthorError):
            rej = Rejection("malformed_output", proposal.message)
            outcomes.append(WindowOutcome(family, "rejected", rejection=rej))
            continue
        if proposal is None:
            outcomes.append(WindowOutcome(family, "declined"))
            continue
        if not isinstance(proposal, Skill) or proposal.family != family:
            rej = Rejection("malformed_output", f"author returned {proposal!r} for {family!r}")
            outcomes.append(WindowOutcome(family, "rejected", rejection=rej))
            continue
        library, rejection = library.admit(proposal, step, prompts, config.style)
        if rejection is None:
            outcomes.append(WindowOutcome(family, "admitted", skill_id=proposal.skill_id))
        else:
            outcomes.append(
                WindowOutcome(family, "rejected", skill_id=proposal.skill_id, rejection=rejection)
            )
    return library, outcomes


def _close_superseded(
    library: SkillLibrary, ledger: TestLedger, step: int, reference_id: str
) -> tuple[TestLedger, list[int]]:
    closed: list[int] = []
    for comp in ledger.open_comparisons():
        status = library.get(comp.skill_id).status
        stale = status == "retired" or (comp.kind == "candidate") != (status == "candidate")
        if stale or context_key(library, comp.skill_id, reference_id) != comp.context:
            ledger = ledger.close(comp.j, "superseded", step)
            closed.append(comp.j)
    return ledger, closed


def validation_round(
    library: SkillLibrary,
    ledger: TestLedger,
    pair_outcomes: Iterable[PairOutcome],
    step: int,
    *,
    reference_id: str = "reference",
    author: Author | None = None,
    evidence_pool: Sequence[Any] = (),
    source_prompts: Sequence[str] = (),
    config: RoundConfig = RoundConfig(),
) -> tuple[SkillLibrary, TestLedger, RoundReport]:
    """Pairs → sequential looks → author window(s) → supersession; returns new library,
    new ledger and a report. Deterministic given a deterministic author.

    ``library`` must be the snapshot the batch's pairs were rolled out with; ``evidence_pool``
    holds :class:`~evosteer_core.skills.author.TrajectorySummary` rows; ``source_prompts``
    are extra task prompts checked for leakage (every evidence-pool prompt always is).
    """
    counts = tally(pair_outcomes)
    new_ledger, registered, superseded = _record_pairs(library, ledger, counts, step, reference_id)
    new_library, new_ledger, decisions = _take_looks(library, new_ledger, step)
    windows: list[WindowOutcome] = []
    if author is not None:
        new_library, windows = _run_windows(
            new_library, author, evidence_pool, source_prompts, step, config
        )
    new_ledger, closed = _close_superseded(new_library, new_ledger, step, reference_id)
    report = RoundReport(
        step=step,
        pair_counts=counts,
        registered=tuple(registered),
        decisions=tuple(decisions),
        superseded=tuple(superseded + closed),
        windows=tuple(windows),
        library_diff=diff(library, new_library),
        alpha_spent=new_ledger.alpha_spent(),
        library_version=new_library.version,
        library_hash=new_library.content_hash,
    )
    return new_library, new_ledger, report


def admit_by_count(
    library: SkillLibrary,
    successes: dict[str, int],
    pair_outcomes: Iterable[PairOutcome],
    step: int,
    k: int,
) -> tuple[SkillLibrary, dict[str, int], tuple[str, ...]]:
    """Fixed-count admission (ablation ``no_sequential_validation``, docs/ablations.md), in
    place of steps 1–2 of a round: a success is a usable candidate pair whose skill arm
    passes (b⁺ = 1, the control arm is not looked at); a candidate with at least ``k``
    successes is validated, unless its family already has its validated maximum (then it
    stays a candidate until a slot frees). No test is taken, nothing is retired, no α is
    spent. Returns (library, successes, promoted ids)."""
    counts = dict(successes)
    for pair in pair_outcomes:
        if pair.kind == "candidate" and pair.usable:
            assert pair.reward_plus is not None  # usable
            counts[pair.skill_id] = counts.get(pair.skill_id, 0) + passes(pair.reward_plus)
    promoted: list[str] = []
    for skill_id in _skill_order(library, counts):
        entry = library.get(skill_id)
        family = entry.skill.family
        full = library.count(family, "validated") >= library.limits.max_validated_per_family
        if entry.status == "candidate" and counts[skill_id] >= k and not full:
            library = library.transition(skill_id, "validated", step)
            promoted.append(skill_id)
    return library, counts, tuple(promoted)
