"""Author windows (docs/method.md §1.8): which families get a window, what evidence the author sees,
and the authors themselves.

No window during warm-up (steps 1..warmup_steps); the first window after it covers every
family (with the warm-up evidence pool); each later step has one window for the family
ranked first by: fewest active skills, most same-task contrasts, lowest mean reward, most
failures. An author proposes at most one candidate, or ``None``; an :class:`AuthorError`
(unusable output) consumes the window.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.roles import RoleSpec
from evosteer_core.executors.base import CallLimits, Executor, NodeRequest
from evosteer_core.infra.seeding import numpy_rng
from evosteer_core.sim.skills import LATENT_SKILLS, skill_effect
from evosteer_core.skills.library import SkillLibrary
from evosteer_core.skills.pairs import passes
from evosteer_core.skills.skill import CONTENT_FIELDS, LIST_FIELDS, Skill, canonical_json

MAX_EVIDENCE = 12


@dataclass(frozen=True)
class TrajectorySummary:
    """One scored trajectory as evidence: its record, task prompt, reward and a text summary."""

    record_id: str
    family: str
    prompt: str
    reward: float | None
    healthy: bool
    side_effect_free: bool
    summary: str

    @property
    def eligible(self) -> bool:
        """Usable as evidence: scored, healthy and side-effect-free."""
        return self.reward is not None and self.healthy and self.side_effect_free

    @property
    def success(self) -> bool:
        assert self.reward is not None
        return bool(passes(self.reward))


@dataclass(frozen=True)
class FamilyStats:
    """What the window ranking and the author see about one family."""

    family: str
    active_skills: int
    contrasts: int
    mean_reward: float | None
    failures: int
    trajectories: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class LibraryLine:
    """One library skill as the author sees it: status, name, trigger (and family)."""

    family: str
    status: str
    name: str
    trigger: str


@dataclass(frozen=True)
class AuthorError:
    """An unusable author output (or a failed author call); it consumes the window."""

    message: str
    raw: str = ""


class Author(Protocol):
    """Proposes at most one candidate skill for a family."""

    def propose(
        self,
        family: str,
        library_view: tuple[LibraryLine, ...],
        family_stats: FamilyStats,
        evidence: tuple[TrajectorySummary, ...],
        step: int,
    ) -> Skill | None | AuthorError: ...


# --------------------------------------------------------------------------- windows


def library_view(library: SkillLibrary) -> tuple[LibraryLine, ...]:
    """Every library skill as (family, status, name, trigger), in admission order."""
    return tuple(
        LibraryLine(e.skill.family, e.status, e.skill.name, e.skill.trigger)
        for e in library.entries
    )


def family_stats(
    family: str, library: SkillLibrary, pool: Iterable[TrajectorySummary]
) -> FamilyStats:
    """Statistics of the family's eligible trajectories in ``pool`` plus its active skills.

    A contrast is a record (same task) with at least one success (r ≥ 1/2) and one failure.
    """
    rows = [t for t in pool if t.family == family and t.eligible]
    outcomes: dict[str, set[bool]] = {}
    for t in rows:
        outcomes.setdefault(t.record_id, set()).add(t.success)
    rewards = [t.reward for t in rows if t.reward is not None]
    return FamilyStats(
        family=family,
        active_skills=library.count(family, "candidate") + library.count(family, "validated"),
        contrasts=sum(1 for s in outcomes.values() if len(s) == 2),
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        failures=sum(1 for t in rows if not t.success),
        trajectories=len(rows),
    )


def rank_families(stats: Iterable[FamilyStats]) -> tuple[str, ...]:
    """Families ordered for the author: fewest active skills, most same-task contrasts,
    lowest mean reward (no data counts as 0), most failures; FAMILIES order breaks ties."""

    def key(s: FamilyStats) -> tuple[Any, ...]:
        mean = 0.0 if s.mean_reward is None else s.mean_reward
        return (s.active_skills, -s.contrasts, mean, -s.failures, FAMILIES.index(s.family))

    return tuple(s.family for s in sorted(stats, key=key))


def window_families(
    step: int,
    library: SkillLibrary,
    pool: Sequence[TrajectorySummary],
    warmup_steps: int = 8,
) -> tuple[str, ...]:
    """The families that get an author window at ``step`` (families without a free slot skipped).

    Steps 1..warmup_steps: none. Step warmup_steps + 1: every family. Later: the best-ranked
    family that can take a candidate.
    """
    if step <= warmup_steps:
        return ()
    open_families = [f for f in FAMILIES if library.admission_block(f) is None]
    if step == warmup_steps + 1:
        return tuple(open_families)
    ranked = rank_families(family_stats(f, library, pool) for f in open_families)
    return ranked[:1]


def select_evidence(
    pool: Iterable[TrajectorySummary], family: str, limit: int = MAX_EVIDENCE
) -> tuple[TrajectorySummary, ...]:
    """≤ ``limit`` eligible trajectories of ``family``: same-task contrasts first.

    For every record with a success and a failure (in order of first appearance), its best
    success followed by its worst failure; then the remaining eligible trajectories in pool
    order.
    """
    rows = [t for t in pool if t.family == family and t.eligible]
    by_record: dict[str, list[TrajectorySummary]] = {}
    for t in rows:
        by_record.setdefault(t.record_id, []).append(t)
    chosen: list[TrajectorySummary] = []
    for group in by_record.values():
        wins = [t for t in group if t.success]
        fails = [t for t in group if not t.success]
        if wins and fails:
            chosen.append(max(wins, key=lambda t: t.reward or 0.0))
            chosen.append(min(fails, key=lambda t: t.reward or 0.0))
    picked = {id(t) for t in chosen}
    chosen += [t for t in rows if id(t) not in picked]
    return tuple(chosen[:limit])


# --------------------------------------------------------------------------- LLM author

AUTHOR_INSTRUCTION = (
    "You write one reusable skill for agents that solve tasks of one family. A skill is a short"
    " procedure: a name, a description of its purpose, a trigger (when to use it), a plan of"
    " 2-5 steps, 1-4 pitfalls and 1-3 constraints. Each item is at most 240 characters, the"
    " whole skill at most 1,100 characters, the name at most 60. State the procedure only: no"
    " claims about how much it helps, no percentages, no first-person narration. Never copy a"
    " task prompt or an answer. Do not repeat a skill already in the library. Learn from the"
    " contrast between successful and failed runs on the same task. Reply with one JSON object"
    ' with exactly the keys "name", "description", "trigger", "plan", "pitfall", "constraint"'
    " (the last three are lists of strings), or with null when no useful skill can be written."
)

AUTHOR_ROLE = RoleSpec(
    role_id="author",
    instruction=AUTHOR_INSTRUCTION,
    max_model_calls=1,
    max_tool_calls=0,
    max_input_tokens=20480,
    max_output_tokens=1024,
)
"""The dedicated author role: one model call, no tools."""

_CARRIER_METRIC = "qa_em"
"""TaskRecord requires a metric; the author's output is parsed, never scored."""


def author_prompt(
    family: str,
    library: tuple[LibraryLine, ...],
    stats: FamilyStats,
    evidence: tuple[TrajectorySummary, ...],
) -> str:
    """The authoring prompt: instruction, family, library lines, statistics, evidence."""
    lib_lines = [f"- [{x.status}] ({x.family}) {x.name}: use when {x.trigger}" for x in library]
    ev_lines = [
        f"### Run {i} (task {t.record_id}, reward {t.reward:.2f}, "
        f"{'success' if t.success else 'failure'})\nTask: {t.prompt}\n{t.summary}"
        for i, t in enumerate(evidence, start=1)
    ]
    return "\n\n".join(
        [
            AUTHOR_INSTRUCTION,
            f"Task family: {family}",
            "Skill library:\n" + ("\n".join(lib_lines) if lib_lines else "(empty)"),
            "Family statistics: " + canonical_json(stats.to_dict()),
            "Scored runs:\n\n" + ("\n\n".join(ev_lines) if ev_lines else "(none)"),
            "Reply with the JSON object or null.",
        ]
    )


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_proposal(text: str, family: str) -> Skill | None | AuthorError:
    """Parse an author reply: a JSON object with the six fields, or ``null``.

    Accepts the JSON bare or inside one code fence; anything else is an :class:`AuthorError`
    naming what was wrong.
    """
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return AuthorError(f"reply is not JSON: {exc.msg} at char {exc.pos}", raw=text)
    if data is None:
        return None
    if not isinstance(data, dict):
        return AuthorError(f"reply is JSON {type(data).__name__}, expected an object", raw=text)
    missing = sorted(set(CONTENT_FIELDS) - set(data))
    extra = sorted(set(data) - set(CONTENT_FIELDS))
    if missing or extra:
        return AuthorError(f"reply has missing keys {missing}, unexpected keys {extra}", raw=text)
    for key in CONTENT_FIELDS:
        value = data[key]
        if key in LIST_FIELDS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return AuthorError(f"field {key!r} must be a list of strings", raw=text)
        elif not isinstance(value, str):
            return AuthorError(f"field {key!r} must be a string", raw=text)
    return Skill.from_dict({**data, "family": family}, where="author reply")


class LLMAuthor:
    """An author backed by any :class:`Executor`: one node run with the author role."""

    def __init__(self, executor: Executor, run_seed: int = 42, role: RoleSpec = AUTHOR_ROLE):
        self.executor = executor
        self.run_seed = run_seed
        self.role = role

    def request(
        self,
        family: str,
        library_view: tuple[LibraryLine, ...],
        family_stats: FamilyStats,
        evidence: tuple[TrajectorySummary, ...],
        step: int,
    ) -> NodeRequest:
        """The node request for one window (deterministic seed key per step and family)."""
        prompt = author_prompt(family, library_view, family_stats, evidence)
        task = TaskRecord(
            record_id=f"skill-author/{step}/{family}",
            source="skill_author",
            family=family,
            prompt=prompt,
            metric=_CARRIER_METRIC,
        )
        role = self.role
        limits = CallLimits(
            max_model_calls=role.max_model_calls,
            max_tool_calls=role.max_tool_calls,
            max_input_tokens=role.max_input_tokens,
            max_output_tokens=role.max_output_tokens,
        )
        return NodeRequest(
            task=task,
            node_id="author",
            role=role,
            tools=(),
            skills=(),
            messages=(),
            previous_output=None,
            prompt=prompt,
            limits=limits,
            seed_key=(self.run_seed, f"author/{step}/{family}", "author", 0),
        )

    def propose(
        self,
        family: str,
        library_view: tuple[LibraryLine, ...],
        family_stats: FamilyStats,
        evidence: tuple[TrajectorySummary, ...],
        step: int,
    ) -> Skill | None | AuthorError:
        result = self.executor.run_node(
            self.request(family, library_view, family_stats, evidence, step)
        )
        if result.failed:
            return AuthorError(
                f"author call failed: status {result.status} ({result.failure_kind})",
                raw=result.text,
            )
        return parse_proposal(result.text, family)


# --------------------------------------------------------------------------- seeded sim author


class SeededSimAuthor:
    """The SIMULATED author of the sim suite: proposes unused skills from the sim's latent pool.

    It models an author whose proposals are relevant to the family and better when the
    evidence holds same-task success/failure contrasts. Each unused latent skill (name not yet
    anywhere in the library) gets a weight: ``irrelevant_weight`` if its hidden effect in the
    family is 0; 1 if it is relevant (non-zero effect); 1 + ``contrast_bonus`` × (contrast
    records / records shown) if it is relevant and helpful. One skill is drawn with these
    weights from a generator seeded by (run seed, "sim-author", step, family). So helpful
    skills are preferred when the evidence supports them, but harmful and null ones are
    still proposed. With no evidence or no unused skill the author declines (None).
    """

    def __init__(
        self, run_seed: int = 42, contrast_bonus: float = 3.0, irrelevant_weight: float = 0.25
    ):
        self.run_seed = run_seed
        self.contrast_bonus = contrast_bonus
        self.irrelevant_weight = irrelevant_weight

    def weights(
        self, family: str, used_names: set[str], evidence: tuple[TrajectorySummary, ...]
    ) -> list[tuple[dict[str, Any], float]]:
        """(latent skill, weight) for every unused latent skill, in pool order."""
        records: dict[str, set[bool]] = {}
        for t in evidence:
            if t.eligible:
                records.setdefault(t.record_id, set()).add(t.success)
        contrast_share = sum(len(s) == 2 for s in records.values()) / max(1, len(records))
        out = []
        for latent in LATENT_SKILLS:
            if latent["name"].casefold() in used_names:
                continue
            eff = skill_effect(latent["name"], family)
            if eff == 0:
                w = self.irrelevant_weight
            elif eff > 0:
                w = 1.0 + self.contrast_bonus * contrast_share
            else:
                w = 1.0
            out.append((latent, w))
        return out

    def propose(
        self,
        family: str,
        library_view: tuple[LibraryLine, ...],
        family_stats: FamilyStats,
        evidence: tuple[TrajectorySummary, ...],
        step: int,
    ) -> Skill | None | AuthorError:
        if not evidence:
            return None
        used = {line.name.casefold() for line in library_view}
        options = self.weights(family, used, evidence)
        if not options:
            return None
        total = sum(w for _, w in options)
        rng = numpy_rng(self.run_seed, "sim-author", step, family)
        idx = int(rng.choice(len(options), p=[w / total for _, w in options]))
        return Skill.from_dict({**options[idx][0], "family": family}, where="latent skill")
