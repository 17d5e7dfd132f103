"""The skill record (docs/method.md §1.8): six content fields, a canonical JSON form and a content id.

A skill is a structured procedure an author distils from scored trajectories. Its id is a
content hash, so the same text always has the same id and two skills with different text
never share one. ``family`` says which task family the skill was written for; it is not part
of the content (and so not of the id).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from evosteer_core.episode.records import FAMILIES
from evosteer_core.executors.base import SkillView

CONTENT_FIELDS: tuple[str, ...] = (
    "name",
    "description",
    "trigger",
    "plan",
    "pitfall",
    "constraint",
)
"""The six content fields, in the order a skill is rendered."""

LIST_FIELDS: tuple[str, ...] = ("plan", "pitfall", "constraint")
"""Content fields that hold a list of items."""

ID_PREFIX = "evosteer-"
ID_HEX_CHARS = 20


def canonical_json(data: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, non-ASCII kept (docs/method.md §1.2 conventions)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Skill:
    """One skill: content fields plus the family it was written for.

    Only types and the family are checked here; the size and content rules are the admission
    filters of :mod:`evosteer_core.skills.filters`, which report a reason code per rejection.
    """

    name: str
    description: str
    trigger: str
    plan: tuple[str, ...]
    pitfall: tuple[str, ...]
    constraint: tuple[str, ...]
    family: str

    def __post_init__(self) -> None:
        for key in ("name", "description", "trigger"):
            if not isinstance(getattr(self, key), str):
                raise TypeError(f"Skill.{key} must be a string, got {getattr(self, key)!r}")
        for key in LIST_FIELDS:
            value = getattr(self, key)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"Skill.{key} must be a tuple of strings, got {value!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"Skill {self.name!r}: family {self.family!r} not in {FAMILIES}")

    def content(self) -> dict[str, Any]:
        """The six content fields as a JSON-able dict (lists for the list fields)."""
        return {
            key: list(getattr(self, key)) if key in LIST_FIELDS else getattr(self, key)
            for key in CONTENT_FIELDS
        }

    def content_json(self) -> str:
        """Canonical JSON of the six content fields; the id hashes exactly this text."""
        return canonical_json(self.content())

    @cached_property
    def skill_id(self) -> str:
        """``evosteer-`` + the first 20 hex digits of sha256(canonical content JSON) (cached)."""
        digest = hashlib.sha256(self.content_json().encode("utf-8")).hexdigest()
        return ID_PREFIX + digest[:ID_HEX_CHARS]

    def text_items(self) -> tuple[str, ...]:
        """Every text item of the content, in render order (name first)."""
        return (
            self.name,
            self.description,
            self.trigger,
            *self.plan,
            *self.pitfall,
            *self.constraint,
        )

    def render(self) -> str:
        """The full text a node prompt shows for a bound skill (docs/method.md §1.1)."""
        lines = [
            f"Skill: {self.name}",
            f"Purpose: {self.description}",
            f"Use when: {self.trigger}",
            "Steps:",
            *(f"{i}. {step}" for i, step in enumerate(self.plan, start=1)),
            "Pitfalls:",
            *(f"- {p}" for p in self.pitfall),
            "Constraint:",
            *(f"- {c}" for c in self.constraint),
        ]
        return "\n".join(lines)

    def view(self) -> SkillView:
        """The executor-facing view: id, name and rendered text."""
        return SkillView(skill_id=self.skill_id, name=self.name, rendered=self.render())

    def to_dict(self) -> dict[str, Any]:
        """Content fields plus ``family``; inverse of :meth:`from_dict`."""
        return {**self.content(), "family": self.family}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "skill") -> Skill:
        """Build a skill from a dict with the six content fields and ``family``.

        Errors name the missing or extra key and ``where`` the skill came from.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        expected = set(CONTENT_FIELDS) | {"family"}
        missing = sorted(expected - set(data))
        extra = sorted(set(data) - expected)
        if missing or extra:
            raise ValueError(f"{where}: missing keys {missing}, unexpected keys {extra}")
        for key in LIST_FIELDS:
            if not isinstance(data[key], list | tuple):
                raise ValueError(f"{where}: field {key!r} must be a list, got {data[key]!r}")
        try:
            return cls(
                **{key: tuple(data[key]) if key in LIST_FIELDS else data[key] for key in expected}
            )
        except TypeError as exc:
            raise ValueError(f"{where}: {exc}") from exc
