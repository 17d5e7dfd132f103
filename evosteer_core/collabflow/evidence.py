"""Candidates, version-bound evidence records, their score and the evidence gate of one
directed update (docs/collabflow.md §2, docs/method.md §2.2).

A :class:`Candidate` is one immutable version of an agent's answer. An :class:`EvidenceRecord`
wraps an executor's :class:`~evosteer_core.executors.base.Evidence` with the provenance id of
the event that produced it and the candidate version it was produced with; copying a
candidate copies its records unchanged, so a copy adds no verification event. The gate
compares evidence scores, never stated confidence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from evosteer_core.episode.answers import normalize_answer
from evosteer_core.executors.base import Evidence

WEIGHTS: dict[str, int] = {"exec_check": 2, "retrieval": 1}
"""Weight of a *passed* record of each kind; failed records and other kinds weigh 0."""

GATE_RULES: tuple[str, ...] = ("evidence", "verbatim", "always_revise")
"""How a gate treats differing answers: the evidence rule, or the ablations that always
adopt the sender's candidate (verbatim exchange) or always revise."""

BRANCHES: tuple[str, ...] = ("equal", "no_answer", "adopt", "keep", "revise")
"""Gate branches: equal normalized answers (keep), a sender that states no answer (keep:
there is nothing to adopt or revise toward), Δ > κ, Δ < −κ, |Δ| ≤ κ."""


@dataclass(frozen=True)
class Candidate:
    """One version of an agent's result: ``version`` is its immutable id, ``answer`` the answer
    it states (None: none), ``text`` the full output that is scored and forwarded, and
    ``env_version`` the environment version it refers to (0 for stateless tasks)."""

    version: str
    agent: str
    answer: str | None
    text: str
    env_version: int = 0

    def key(self) -> str:
        """The normalized answer by which candidates are compared ("" when none is stated)."""
        return normalize_answer(self.answer) if self.answer else ""


@dataclass(frozen=True)
class EvidenceRecord:
    """An immutable evidence record: ``record_id`` identifies the verification event (its
    provenance), ``version``/``env_version`` the candidate it was produced with, ``source``
    the agent whose execution produced it."""

    record_id: str
    version: str
    env_version: int
    source: str
    evidence: Evidence

    @property
    def weight(self) -> int:
        return WEIGHTS.get(self.evidence.kind, 0) if self.evidence.passed else 0


def provenance_id(*parts: object) -> str:
    """A stable record id from the event that produced it (run seed, episode, agent, call,
    record index): the same event always gets the same id, two events never share one."""
    text = "\x1f".join(repr(p) for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def records_of(
    evidence: Iterable[Evidence], candidate: Candidate, event: tuple[object, ...]
) -> tuple[EvidenceRecord, ...]:
    """Bind the evidence one execution produced to the candidate it produced; ``event``
    (run seed, episode key, agent, call index) plus the record's index is its provenance."""
    return tuple(
        EvidenceRecord(
            provenance_id(*event, i), candidate.version, candidate.env_version, candidate.agent, e
        )
        for i, e in enumerate(evidence)
    )


def applies(record: EvidenceRecord, candidate: Candidate) -> bool:
    """The applicability predicate A(e, a) (docs/collabflow.md §2): same environment version,
    and either the record names the answer it checked and that answer is the candidate's
    (a check of an artifact holds for every version with the same artifact: the declared
    transfer), or it names none and was produced with this very version. A candidate that
    states no answer has nothing a record could check."""
    if record.env_version != candidate.env_version or candidate.answer is None:
        return False
    subject = record.evidence.subject
    if subject is not None:
        return candidate.answer is not None and normalize_answer(subject) == candidate.key()
    return record.version == candidate.version


def filter_evidence(
    records: Iterable[EvidenceRecord], candidate: Candidate
) -> tuple[EvidenceRecord, ...]:
    """Filter(E, a): the records that still check ``candidate``, one per record id (first
    occurrence kept, order preserved)."""
    seen: set[str] = set()
    out = []
    for r in records:
        if r.record_id not in seen and applies(r, candidate):
            seen.add(r.record_id)
            out.append(r)
    return tuple(out)


def score(candidate: Candidate, records: Iterable[EvidenceRecord]) -> int:
    """ℓ = the largest weight among the records that apply to ``candidate``, else 0."""
    return max((r.weight for r in filter_evidence(records, candidate)), default=0)


@dataclass(frozen=True)
class Holding:
    """What an agent holds: a candidate and its (filtered) evidence."""

    candidate: Candidate
    evidence: tuple[EvidenceRecord, ...] = ()

    @classmethod
    def of(cls, candidate: Candidate, records: Iterable[EvidenceRecord]) -> Holding:
        """``candidate`` with the records of ``records`` that apply to it."""
        return cls(candidate, filter_evidence(records, candidate))

    @property
    def score(self) -> int:
        return score(self.candidate, self.evidence)


Reviser = Callable[[Holding, Holding], "Holding | None"]
"""``revise(receiver, sender)``: one bounded tool-free call; the new holding (already filtered
by :meth:`Holding.of` against the pooled evidence), or None when it failed (fallback: keep)."""


@dataclass(frozen=True)
class GateResult:
    """One gate evaluation: its branch, the score gap and the receiver's holding after it;
    ``revised`` is False when a revision was due but failed (the receiver kept its own)."""

    branch: str
    delta: int
    after: Holding
    revised: bool = False


def gate(
    sender: Holding, receiver: Holding, kappa: float, revise: Reviser, rule: str = "evidence"
) -> GateResult:
    """The gate of one update sender → receiver (docs/method.md §2.2, paper Eq. 7): equal
    normalized answers keep, and so does a sender that states no answer; else Δ = ℓ_sender − ℓ_receiver, Δ > κ adopts the sender's
    candidate with its records (copied unchanged), Δ < −κ keeps, |Δ| ≤ κ revises once.
    ``rule`` ``verbatim``/``always_revise`` replace the comparison by always adopting /
    always revising (ablations)."""
    if rule not in GATE_RULES:
        raise ValueError(f"gate rule must be one of {GATE_RULES}, got {rule!r}")
    delta = sender.score - receiver.score
    if sender.candidate.key() == receiver.candidate.key():
        return GateResult("equal", delta, receiver)
    if sender.candidate.answer is None:
        return GateResult("no_answer", delta, receiver)
    if rule == "verbatim" or (rule == "evidence" and delta > kappa):
        return GateResult("adopt", delta, sender)
    if rule == "evidence" and delta < -kappa:
        return GateResult("keep", delta, receiver)
    revised = revise(receiver, sender)
    if revised is None:
        return GateResult("revise", delta, receiver, revised=False)
    return GateResult("revise", delta, revised, revised=True)
