"""Admission filters for candidate skills (docs/method.md §1.8).

Each check returns ``None`` when the skill passes or a :class:`Rejection` with a reason code
from :data:`REJECTION_CODES` and a message naming the offending field. :func:`screen` runs
them in a fixed order and reports the first failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from evosteer_core.skills.skill import LIST_FIELDS, Skill


@dataclass(frozen=True)
class StyleLimits:
    """Size limits of docs/method.md §1.8: characters per item, in total, in the name; items per list."""

    max_item_chars: int = 240
    max_total_chars: int = 1100
    max_name_chars: int = 60
    list_lengths: tuple[tuple[str, int, int], ...] = (
        ("plan", 2, 5),
        ("pitfall", 1, 4),
        ("constraint", 1, 3),
    )


REJECTION_CODES: tuple[str, ...] = (
    "empty_field",
    "list_length",
    "name_too_long",
    "item_too_long",
    "total_too_long",
    "efficacy_claim",
    "duplicate_name",
    "duplicate_content",
    "prompt_leakage",
    "family_full",
    "malformed_output",
)
"""Every reason a proposal can be turned away (the last two come from the library and the
author parser)."""


@dataclass(frozen=True)
class Rejection:
    """Why a proposal was not admitted: a code from :data:`REJECTION_CODES` and a message."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in REJECTION_CODES:
            raise ValueError(f"rejection code {self.code!r} not in {REJECTION_CODES}")


CLAIM_PATTERNS: tuple[tuple[str, str], ...] = (
    (
        "efficacy verb",
        r"\b(improv|boost|increas|rais|enhanc)\w*\s+(the\s+)?(accuracy|performance|"
        r"score|success|reward|results?|pass\s+rate)",
    ),
    ("boost", r"\bboosts?\b"),
    ("guarantee", r"\bguarantee[sd]?\b"),
    ("percentage", r"\d\s*%|\bper\s?cent\b"),
    (
        "first-person narration",
        r"\bI\s+(will|would|am|have|think|found|noticed|suggest)\b|\bI'(ll|m|ve)\b",
    ),
    ("we narration", r"\bwe\s+(will|found|observed|noticed|saw|think)\b"),
    ("self-reference", r"\bthis\s+skill\s+(helps|improves|will|makes|increases|ensures|boosts)\b"),
    ("absolute claim", r"\b(always\s+works|never\s+fails|proven|state[-\s]of[-\s]the[-\s]art)\b"),
    ("experience narration", r"\bin\s+(my|our)\s+experience\b|\bas\s+an\s+ai\b"),
)
"""(label, case-insensitive regex) pairs for narration and efficacy claims. A skill states a
procedure; it may not claim what it achieves nor narrate who wrote it. A bare ``%`` (Python's
modulo in a code skill) is allowed; a number followed by ``%`` is a claim."""

_CLAIM_RES = tuple((label, re.compile(rx, re.IGNORECASE)) for label, rx in CLAIM_PATTERNS)


def normalize_text(text: str) -> str:
    """Casefold and collapse every whitespace run to one space (leakage and name matching)."""
    return " ".join(text.casefold().split())


def check_style(skill: Skill, limits: StyleLimits = StyleLimits()) -> Rejection | None:
    """Non-empty fields, list lengths, name length, item length and total length."""
    for key in ("name", "description", "trigger"):
        if not getattr(skill, key).strip():
            return Rejection("empty_field", f"field {key!r} is empty")
    for key, low, high in limits.list_lengths:
        items = getattr(skill, key)
        if not low <= len(items) <= high:
            return Rejection(
                "list_length", f"{key!r} has {len(items)} items, expected {low}-{high}"
            )
        for i, item in enumerate(items):
            if not item.strip():
                return Rejection("empty_field", f"{key}[{i}] is empty")
    if len(skill.name) > limits.max_name_chars:
        return Rejection(
            "name_too_long", f"name has {len(skill.name)} chars, limit {limits.max_name_chars}"
        )
    labelled = [("description", skill.description), ("trigger", skill.trigger)]
    labelled += [
        (f"{key}[{i}]", item) for key in LIST_FIELDS for i, item in enumerate(getattr(skill, key))
    ]
    for label, item in labelled:
        if len(item) > limits.max_item_chars:
            return Rejection(
                "item_too_long", f"{label} has {len(item)} chars, limit {limits.max_item_chars}"
            )
    total = sum(len(t) for t in skill.text_items())
    if total > limits.max_total_chars:
        return Rejection(
            "total_too_long", f"skill text has {total} chars, limit {limits.max_total_chars}"
        )
    return None


def check_claims(skill: Skill) -> Rejection | None:
    """Reject narration and efficacy claims (:data:`CLAIM_PATTERNS`) in any text item."""
    for text in skill.text_items():
        for label, pattern in _CLAIM_RES:
            match = pattern.search(text)
            if match:
                return Rejection("efficacy_claim", f"{label} {match.group(0)!r} in {text[:80]!r}")
    return None


def check_duplicates(skill: Skill, existing: Iterable[Skill]) -> Rejection | None:
    """Reject a name already in the library (normalized) or the same content hash."""
    name = normalize_text(skill.name)
    skill_id = skill.skill_id
    for other in existing:
        if other.skill_id == skill_id:
            return Rejection("duplicate_content", f"same content as {other.name!r} ({skill_id})")
        if normalize_text(other.name) == name:
            return Rejection("duplicate_name", f"name {skill.name!r} is already in the library")
    return None


def check_leakage(
    skill: Skill, source_prompts: Iterable[str], min_chars: int = 32
) -> Rejection | None:
    """Reject a skill whose text contains a normalized source prompt of ≥ ``min_chars`` chars."""
    text = normalize_text("\n".join(skill.text_items()))
    for prompt in source_prompts:
        needle = normalize_text(prompt)
        if len(needle) >= min_chars and needle in text:
            return Rejection(
                "prompt_leakage", f"skill text contains the task prompt {needle[:60]!r}…"
            )
    return None


def screen(
    skill: Skill,
    existing: Iterable[Skill],
    source_prompts: Iterable[str],
    limits: StyleLimits = StyleLimits(),
    min_leak_chars: int = 32,
) -> Rejection | None:
    """All admission filters in order: style, claims, duplicates, leakage. First failure wins."""
    return (
        check_style(skill, limits)
        or check_claims(skill)
        or check_duplicates(skill, existing)
        or check_leakage(skill, source_prompts, min_leak_chars)
    )
