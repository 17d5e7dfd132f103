"""The skill library (docs/method.md §1.8): statuses, slot limits, per-family menus, versions, diffs.

A :class:`SkillLibrary` is immutable: every change returns a new library with ``version``
one higher. ``content_hash`` is the sha256 of the canonical JSON of the state (entries and
limits, not the version), so two libraries with the same skills and statuses hash alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from evosteer_core.episode.records import FAMILIES
from evosteer_core.executors.base import SkillView
from evosteer_core.skills.filters import Rejection, StyleLimits, screen
from evosteer_core.skills.skill import Skill, canonical_json

STATUSES: tuple[str, ...] = ("candidate", "validated", "retired")

TRANSITIONS: dict[str, tuple[str, ...]] = {
    "candidate": ("validated", "retired"),
    "validated": ("retired",),
    "retired": (),
}
"""Allowed status changes: candidate → validated | retired; validated → retired."""


class LibraryError(ValueError):
    """An illegal library change: unknown skill, forbidden transition or a full slot."""


@dataclass(frozen=True)
class LibraryLimits:
    """Slot limits: all skills, per family (retired count), validated and candidates per family."""

    max_total: int = 60
    max_per_family: int = 12
    max_validated_per_family: int = 3
    max_candidates_per_family: int = 1


@dataclass(frozen=True)
class SkillEntry:
    """A skill with its status and the steps at which it was added and last changed."""

    skill: Skill
    status: str
    added_step: int
    changed_step: int

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise LibraryError(
                f"skill {self.skill.name!r}: status {self.status!r} not in {STATUSES}"
            )

    @property
    def skill_id(self) -> str:
        return self.skill.skill_id

    def to_dict(self) -> dict[str, Any]:
        return {
            "skill_id": self.skill_id,
            "skill": self.skill.to_dict(),
            "status": self.status,
            "added_step": self.added_step,
            "changed_step": self.changed_step,
        }


@dataclass(frozen=True)
class SkillLibrary:
    """All skills ever admitted, in admission order, with their statuses."""

    entries: tuple[SkillEntry, ...] = ()
    version: int = 0
    limits: LibraryLimits = field(default_factory=LibraryLimits)

    # ----------------------------------------------------------------- queries
    def get(self, skill_id: str) -> SkillEntry:
        for entry in self.entries:
            if entry.skill_id == skill_id:
                return entry
        raise LibraryError(f"no skill {skill_id!r} in the library (version {self.version})")

    def family_entries(self, family: str, status: str | None = None) -> tuple[SkillEntry, ...]:
        """Entries of one family in admission order, optionally of one status only."""
        return tuple(
            e
            for e in self.entries
            if e.skill.family == family and (status is None or e.status == status)
        )

    def count(self, family: str, status: str | None = None) -> int:
        return len(self.family_entries(family, status))

    def menu_entries(self, family: str) -> tuple[SkillEntry, ...]:
        """What the orchestrator may select in ``family``: validated skills, then candidates."""
        return self.family_entries(family, "validated") + self.family_entries(family, "candidate")

    def menu(self, family: str) -> tuple[SkillView, ...]:
        """The family's skill menu as executor views (candidates are selectable while tested)."""
        return tuple(e.skill.view() for e in self.menu_entries(family))

    def deployed_menu(self, family: str) -> tuple[SkillView, ...]:
        """The family's test-time menu: its validated skills only (docs/method.md, test-time
        protocol: a candidate is tried only inside training, where its paired test runs)."""
        return tuple(e.skill.view() for e in self.family_entries(family, "validated"))

    def admission_block(self, family: str) -> Rejection | None:
        """Why no candidate can be added to ``family`` now (``None`` if one can)."""
        lim = self.limits
        if len(self.entries) >= lim.max_total:
            return Rejection(
                "family_full", f"library holds {len(self.entries)}/{lim.max_total} skills"
            )
        if self.count(family) >= lim.max_per_family:
            return Rejection(
                "family_full", f"family {family!r} holds {self.count(family)}/{lim.max_per_family}"
            )
        if self.count(family, "candidate") >= lim.max_candidates_per_family:
            return Rejection("family_full", f"family {family!r} already has a candidate under test")
        return None

    # ----------------------------------------------------------------- changes
    def add_candidate(self, skill: Skill, step: int) -> SkillLibrary:
        """A new library with ``skill`` as a candidate; raises :class:`LibraryError` if blocked."""
        block = self.admission_block(skill.family)
        if block is not None:
            raise LibraryError(f"cannot add {skill.name!r}: {block.message}")
        if any(e.skill_id == skill.skill_id for e in self.entries):
            raise LibraryError(f"skill {skill.skill_id} is already in the library")
        entry = SkillEntry(skill=skill, status="candidate", added_step=step, changed_step=step)
        return replace(self, entries=(*self.entries, entry), version=self.version + 1)

    def admit(
        self,
        skill: Skill,
        step: int,
        source_prompts: Iterable[str],
        style: StyleLimits = StyleLimits(),
    ) -> tuple[SkillLibrary, Rejection | None]:
        """Screen ``skill`` (filters, then slot limits) and add it as a candidate if it passes.

        Returns the (possibly unchanged) library and the rejection, if any.
        """
        rejection = screen(skill, (e.skill for e in self.entries), source_prompts, style)
        rejection = rejection or self.admission_block(skill.family)
        if rejection is not None:
            return self, rejection
        return self.add_candidate(skill, step), None

    def transition(self, skill_id: str, status: str, step: int) -> SkillLibrary:
        """A new library with ``skill_id`` moved to ``status`` (only the allowed transitions)."""
        entry = self.get(skill_id)
        if status not in TRANSITIONS[entry.status]:
            raise LibraryError(
                f"skill {entry.skill.name!r} ({skill_id}): transition {entry.status} → {status} "
                f"is not allowed; allowed from {entry.status}: {TRANSITIONS[entry.status]}"
            )
        family = entry.skill.family
        if status == "validated" and (
            self.count(family, "validated") >= self.limits.max_validated_per_family
        ):
            raise LibraryError(
                f"cannot validate {entry.skill.name!r}: family {family!r} already has "
                f"{self.limits.max_validated_per_family} validated skills"
            )
        new = replace(entry, status=status, changed_step=step)
        entries = tuple(new if e.skill_id == skill_id else e for e in self.entries)
        return replace(self, entries=entries, version=self.version + 1)

    # ----------------------------------------------------------------- serialization
    def state(self) -> dict[str, Any]:
        """The hashed state: entries and limits (not the version)."""
        return {
            "entries": [e.to_dict() for e in self.entries],
            "limits": {
                "max_total": self.limits.max_total,
                "max_per_family": self.limits.max_per_family,
                "max_validated_per_family": self.limits.max_validated_per_family,
                "max_candidates_per_family": self.limits.max_candidates_per_family,
            },
        }

    @property
    def content_hash(self) -> str:
        """sha256 hex of the canonical JSON of :meth:`state`."""
        return hashlib.sha256(canonical_json(self.state()).encode("utf-8")).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: state plus version and content hash (checked by :meth:`from_dict`)."""
        return {**self.state(), "version": self.version, "content_hash": self.content_hash}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SkillLibrary:
        """Inverse of :meth:`to_dict`; verifies ids and the content hash."""
        try:
            limits = LibraryLimits(**data["limits"])
            entries = []
            for i, raw in enumerate(data["entries"]):
                skill = Skill.from_dict(raw["skill"], where=f"library entry {i}")
                if skill.skill_id != raw["skill_id"]:
                    raise LibraryError(
                        f"library entry {i}: stored id {raw['skill_id']} != content id "
                        f"{skill.skill_id}"
                    )
                entries.append(
                    SkillEntry(skill, raw["status"], raw["added_step"], raw["changed_step"])
                )
            library = cls(entries=tuple(entries), version=int(data["version"]), limits=limits)
        except KeyError as exc:
            raise LibraryError(f"library dict lacks key {exc}") from exc
        if "content_hash" in data and data["content_hash"] != library.content_hash:
            raise LibraryError(
                f"library content hash mismatch: stored {data['content_hash']}, "
                f"computed {library.content_hash}"
            )
        for family in FAMILIES:
            if library.count(family, "validated") > limits.max_validated_per_family:
                raise LibraryError(f"library dict: family {family!r} exceeds the validated limit")
        return library


@dataclass(frozen=True)
class LibraryDiff:
    """What changed between two library versions: ids added, (id, old, new) status changes,
    and the ids that became retired."""

    added: tuple[str, ...]
    changed: tuple[tuple[str, str, str], ...]
    retired: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "added": list(self.added),
            "changed": [list(c) for c in self.changed],
            "retired": list(self.retired),
        }


def diff(old: SkillLibrary, new: SkillLibrary) -> LibraryDiff:
    """Skills added in ``new``, status changes of skills in both, and newly retired ids."""
    before = {e.skill_id: e.status for e in old.entries}
    added = tuple(e.skill_id for e in new.entries if e.skill_id not in before)
    changed = tuple(
        (e.skill_id, before[e.skill_id], e.status)
        for e in new.entries
        if e.skill_id in before and before[e.skill_id] != e.status
    )
    retired = tuple(
        e.skill_id
        for e in new.entries
        if e.status == "retired" and before.get(e.skill_id) != "retired"
    )
    missing = sorted(set(before) - {e.skill_id for e in new.entries})
    if missing:
        raise LibraryError(f"diff: skills {missing} vanished; libraries only grow")
    return LibraryDiff(added=added, changed=changed, retired=retired)
