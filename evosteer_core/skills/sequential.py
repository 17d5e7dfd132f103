"""Sequential sign tests with a shared alpha-spending ledger (docs/method.md §1.8, Eqs. 11–12, App. C).

A *comparison* is one registered test of one skill against its control arm under a fixed
context (reference policy and background menu). Comparison j (global registration index,
1, 2, …) at look ℓ (1, 2, …) spends a_{j,ℓ} = α / (j(j+1) ℓ(ℓ+1)), a_{j,ℓ}/2 per direction,
on the exact one-sided tails p+ = P{Bin(D,1/2) ≥ W}, p− = P{Bin(D,1/2) ≥ L}. Since
Σ_j Σ_ℓ 1/(j(j+1) ℓ(ℓ+1)) = 1, any realized run spends at most α (Prop. C.5). A look is taken
only when the comparison has new discordant pairs since its previous look.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from evosteer_core.skills.pairs import PairCounts

ALPHA = 0.05
DIRECTIONS: tuple[str, ...] = ("+", "-")
DECISIONS: tuple[str, ...] = ("retire", "promote", "defer", "confirm", "keep")
"""Look decisions: retire (p− cleared), promote a candidate (p+ cleared), defer a promotion
(family already has its validated maximum), confirm a validated skill (p+ cleared on a
re-evaluation; no status change), keep accumulating."""

CLOSE_REASONS: tuple[str, ...] = ("promoted", "retired", "superseded")


class LedgerError(ValueError):
    """An illegal ledger operation (unknown or closed comparison, a look without new evidence)."""


@lru_cache(maxsize=4096)
def _fair_tails(d: int) -> tuple[float, ...]:
    """P{Bin(d,1/2) ≥ k} for k = 0..d+1, each an exactly rounded ratio of integers."""
    tails = [0] * (d + 2)
    for k in range(d, -1, -1):
        tails[k] = tails[k + 1] + math.comb(d, k)
    return tuple(t / (1 << d) for t in tails)


def upper_tail(d: int, k: int) -> float:
    """P{Bin(d, 1/2) ≥ k}, exact (integer binomial sums, one rounding)."""
    if d < 0:
        raise ValueError(f"number of discordant pairs must be ≥ 0, got {d}")
    if k <= 0:
        return 1.0
    if k > d:
        return 0.0
    return _fair_tails(d)[k]


def sign_test(wins: int, losses: int) -> tuple[float, float]:
    """(p+, p−) = (P{Bin(D,1/2) ≥ W}, P{Bin(D,1/2) ≥ L}), D = W + L; both 1 when D = 0."""
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be ≥ 0, got W={wins}, L={losses}")
    d = wins + losses
    if d == 0:
        return 1.0, 1.0
    return upper_tail(d, wins), upper_tail(d, losses)


def look_level(j: int, look: int, alpha: float = ALPHA) -> float:
    """a_{j,ℓ} = α / (j(j+1) ℓ(ℓ+1)); each direction receives half of it."""
    if j < 1 or look < 1:
        raise ValueError(f"registration index and look index start at 1, got j={j}, ℓ={look}")
    return alpha / (j * (j + 1) * look * (look + 1))


def effect(wins: int, losses: int, ties: int) -> float | None:
    """Δ̂ = (W − L)/(W + L + T0); None when no pair exists (undefined, not zero)."""
    n = wins + losses + ties
    return None if n == 0 else (wins - losses) / n


def decide(p_plus: float, p_minus: float, level: float, status: str, validated_full: bool) -> str:
    """The look decision for a skill of ``status`` given both p-values and the look level."""
    if p_minus <= level / 2:
        return "retire"
    if p_plus <= level / 2:
        if status == "validated":
            return "confirm"
        return "defer" if validated_full else "promote"
    return "keep"


@dataclass(frozen=True)
class Comparison:
    """One registered comparison and its accumulated pair counts.

    ``context`` fingerprints what was fixed at registration (reference, background menu);
    ``discordant_at_last_look`` is D when the last look was taken (a new look needs more).
    """

    j: int
    skill_id: str
    family: str
    kind: str
    context: str
    registered_step: int
    counts: PairCounts = PairCounts()
    looks: int = 0
    discordant_at_last_look: int = 0
    closed_step: int | None = None
    close_reason: str | None = None

    @property
    def is_open(self) -> bool:
        return self.close_reason is None

    @property
    def has_new_evidence(self) -> bool:
        return self.counts.discordant > self.discordant_at_last_look

    @property
    def effect(self) -> float | None:
        c = self.counts
        return effect(c.wins, c.losses, c.ties)

    def to_dict(self) -> dict[str, Any]:
        return {
            "j": self.j,
            "skill_id": self.skill_id,
            "family": self.family,
            "kind": self.kind,
            "context": self.context,
            "registered_step": self.registered_step,
            "wins": self.counts.wins,
            "losses": self.counts.losses,
            "ties": self.counts.ties,
            "excluded": self.counts.excluded,
            "looks": self.looks,
            "discordant_at_last_look": self.discordant_at_last_look,
            "closed_step": self.closed_step,
            "close_reason": self.close_reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Comparison:
        counts = PairCounts(d["wins"], d["losses"], d["ties"], d["excluded"])
        return cls(
            j=d["j"],
            skill_id=d["skill_id"],
            family=d["family"],
            kind=d["kind"],
            context=d["context"],
            registered_step=d["registered_step"],
            counts=counts,
            looks=d["looks"],
            discordant_at_last_look=d["discordant_at_last_look"],
            closed_step=d["closed_step"],
            close_reason=d["close_reason"],
        )


@dataclass(frozen=True)
class TestRecord:
    """One directional test: (j, ℓ, direction, level, p-value) and what the look decided."""

    __test__ = False  # not a pytest class

    j: int
    look: int
    direction: str
    level: float
    p_value: float
    rejected: bool
    decision: str
    step: int
    skill_id: str
    wins: int
    losses: int
    ties: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class TestLedger:
    """Every comparison ever registered and every directional test ever taken.

    Immutable; each operation returns a new ledger. JSON-serializable via :meth:`to_dict`.
    """

    __test__ = False  # not a pytest class

    alpha: float = ALPHA
    comparisons: tuple[Comparison, ...] = ()
    records: tuple[TestRecord, ...] = field(default=())

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise LedgerError(f"alpha must be in (0, 1), got {self.alpha}")

    # ----------------------------------------------------------------- queries
    def comparison(self, j: int) -> Comparison:
        if not 1 <= j <= len(self.comparisons):
            raise LedgerError(f"no comparison j={j}; registered: 1..{len(self.comparisons)}")
        return self.comparisons[j - 1]

    def open_comparison(self, skill_id: str) -> Comparison | None:
        """The open comparison of ``skill_id`` (at most one is open per skill)."""
        return next((c for c in self.comparisons if c.is_open and c.skill_id == skill_id), None)

    def open_comparisons(self) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.is_open)

    def observations(self, skill_id: str) -> int:
        """Usable pairs observed for ``skill_id`` over all its comparisons."""
        return sum(c.counts.observations for c in self.comparisons if c.skill_id == skill_id)

    def alpha_spent(self) -> float:
        """Σ of the levels of every directional test taken (≤ α by Prop. C.5)."""
        return math.fsum(r.level for r in self.records)

    # ----------------------------------------------------------------- changes
    def register(
        self, skill_id: str, family: str, kind: str, context: str, step: int
    ) -> tuple[TestLedger, int]:
        """Open a new comparison with the next global index j; returns (ledger, j)."""
        if self.open_comparison(skill_id) is not None:
            raise LedgerError(f"skill {skill_id} already has an open comparison")
        j = len(self.comparisons) + 1
        comp = Comparison(j, skill_id, family, kind, context, step)
        return replace(self, comparisons=(*self.comparisons, comp)), j

    def _put(self, comp: Comparison) -> TestLedger:
        comps = list(self.comparisons)
        comps[comp.j - 1] = comp
        return replace(self, comparisons=tuple(comps))

    def add_pairs(self, j: int, counts: PairCounts) -> TestLedger:
        """Add pair counts to open comparison j."""
        comp = self.comparison(j)
        if not comp.is_open:
            raise LedgerError(f"comparison j={j} is closed ({comp.close_reason})")
        return self._put(replace(comp, counts=comp.counts + counts))

    def close(self, j: int, reason: str, step: int) -> TestLedger:
        """Close comparison j for ``reason`` (one of :data:`CLOSE_REASONS`)."""
        if reason not in CLOSE_REASONS:
            raise LedgerError(f"close reason {reason!r} not in {CLOSE_REASONS}")
        comp = self.comparison(j)
        if not comp.is_open:
            raise LedgerError(f"comparison j={j} is already closed ({comp.close_reason})")
        return self._put(replace(comp, closed_step=step, close_reason=reason))

    def take_look(
        self, j: int, step: int, status: str, validated_full: bool
    ) -> tuple[TestLedger, str]:
        """Take look ℓ = looks + 1 of comparison j: both directional tests and the decision.

        A promotion or retirement closes the comparison. Raises if j is closed or has no new
        discordant pairs since its previous look (such a look would spend level for nothing).
        """
        comp = self.comparison(j)
        if not comp.is_open:
            raise LedgerError(f"comparison j={j} is closed ({comp.close_reason})")
        if not comp.has_new_evidence:
            raise LedgerError(f"comparison j={j} has no new discordant pairs since its last look")
        look = comp.looks + 1
        level = look_level(j, look, self.alpha)
        c = comp.counts
        p_plus, p_minus = sign_test(c.wins, c.losses)
        decision = decide(p_plus, p_minus, level, status, validated_full)
        records = tuple(
            TestRecord(
                j,
                look,
                d,
                level / 2,
                p,
                p <= level / 2,
                decision,
                step,
                comp.skill_id,
                c.wins,
                c.losses,
                c.ties,
            )
            for d, p in (("+", p_plus), ("-", p_minus))
        )
        comp = replace(comp, looks=look, discordant_at_last_look=c.discordant)
        if decision in ("promote", "retire"):
            reason = "promoted" if decision == "promote" else "retired"
            comp = replace(comp, closed_step=step, close_reason=reason)
        ledger = replace(self._put(comp), records=self.records + records)
        return ledger, decision

    # ----------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "records": [r.to_dict() for r in self.records],
            "alpha_spent": self.alpha_spent(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TestLedger:
        try:
            comps = tuple(Comparison.from_dict(c) for c in data["comparisons"])
            records = tuple(TestRecord(**r) for r in data["records"])
            ledger = cls(alpha=data["alpha"], comparisons=comps, records=records)
        except (KeyError, TypeError) as exc:
            raise LedgerError(f"malformed ledger dict: {exc}") from exc
        for i, c in enumerate(comps, start=1):
            if c.j != i:
                raise LedgerError(f"ledger comparison {i} carries index j={c.j}")
        return ledger
