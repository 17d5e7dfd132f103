"""TextWorld games as interactive task records (benchmark ``textworld``, task type alfworld).

A record does not hold a game; it holds what determines one: the generator seed and the
sizes of the world and the quest (:class:`GameSpec`, in ``meta``). The environment
(``executors.textworld_env``) generates the game from that spec on first use, so the same
record always plays the same game. Records come from a JSONL file of specs or, without a
path, from the built-in suite (:func:`suite_rows`; docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from evosteer_core.benchmarks.rows import Row
from evosteer_core.benchmarks.taskmap import family_of
from evosteer_core.episode.records import TaskRecord
from evosteer_core.infra.seeding import derive_seed

HARNESS = "textworld"
TEXTWORLD_MAX_STEPS = 50
"""Commands per game, as for ALFWorld, the family's IID benchmark (paper App. D)."""

SUITE_SIZE = 600
SUITE_LEVELS: tuple[tuple[int, int, int], ...] = ((2, 4, 2), (3, 6, 3), (5, 10, 5))
"""(rooms, objects, quest length) of the built-in suite's records, in turn."""

SUITE_SOURCE = Path("<built-in textworld suite>")
SPEC_BOUNDS: dict[str, tuple[int, int]] = {
    "seed": (0, 2**32 - 1),  # TextWorld seeds numpy's RandomState
    "rooms": (1, 50),
    "objects": (0, 100),
    "quest_length": (1, 30),
}
"""The inclusive range of each :class:`GameSpec` field."""


@dataclass(frozen=True)
class GameSpec:
    """What determines one TextWorld game: the generator seed and the world and quest sizes."""

    seed: int
    rooms: int
    objects: int
    quest_length: int

    def __post_init__(self) -> None:
        for name, (low, high) in SPEC_BOUNDS.items():
            value = getattr(self, name)
            if not _int_in(value, low, high):
                raise ValueError(f"{name}: expected an integer in [{low}, {high}], got {value!r}")

    @classmethod
    def of(cls, task: TaskRecord) -> GameSpec:
        """The spec in a textworld record's ``meta``; ValueError naming the record otherwise."""
        meta = task.meta
        if meta.get("harness") != HARNESS:
            raise ValueError(
                f"record {task.record_id!r} ({task.source}) is not a TextWorld game "
                f"(meta.harness is {meta.get('harness', task.source)!r})"
            )
        try:
            return cls(**{name: meta[name] for name in SPEC_BOUNDS})
        except KeyError as exc:
            raise ValueError(
                f"record {task.record_id!r}: meta lacks the game field {exc}"
            ) from None
        except ValueError as exc:
            raise ValueError(f"record {task.record_id!r}: meta.{exc}") from None

    def key(self) -> str:
        """A file-name-safe name of the game (the cache folder's name)."""
        return f"s{self.seed}-r{self.rooms}-o{self.objects}-q{self.quest_length}"


def _int_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _int_field(row: Row, key: str, low: int, high: int) -> int:
    value = row.raw(key)
    if not _int_in(value, low, high):
        raise row.error(key, f"an integer in [{low}, {high}]", value)
    return value


def textworld_record(row: Row) -> TaskRecord:
    """A game spec row: ``id``, ``seed``, ``rooms``, ``objects``, ``quest_length`` (ranges in
    :data:`SPEC_BOUNDS`), optional ``max_steps`` (default 50)."""
    spec = GameSpec(**{key: _int_field(row, key, *SPEC_BOUNDS[key]) for key in SPEC_BOUNDS})
    max_steps = (
        _int_field(row, "max_steps", 1, 10_000) if row.has("max_steps") else TEXTWORLD_MAX_STEPS
    )
    prompt = (
        f"Win this TextWorld text adventure: a house of {spec.rooms} rooms with "
        f"{spec.objects} objects and a quest of {spec.quest_length} steps. The game states "
        "its objective in the observation; play it with short text commands such as "
        f"'go east', 'open chest' or 'take key' (at most {max_steps} commands)."
    )
    return TaskRecord(
        record_id=f"textworld/{row.record_id('id')}",
        source="textworld",
        family=family_of("textworld"),
        prompt=prompt,
        metric="interactive",
        meta={"harness": HARNESS, **asdict(spec), "max_steps": max_steps},
    )


def suite_rows(n: int = SUITE_SIZE) -> Iterator[Row]:
    """The built-in suite as spec rows: row ``i`` (ids ``0001``...) has a seed derived from
    ``i`` and the sizes of level ``(i - 1) mod 3`` of :data:`SUITE_LEVELS`."""
    for i in range(1, n + 1):
        rooms, objects, quest_length = SUITE_LEVELS[(i - 1) % len(SUITE_LEVELS)]
        data = {
            "id": f"{i:04d}",
            "seed": derive_seed("textworld-suite", i) % 2**31,
            "rooms": rooms,
            "objects": objects,
            "quest_length": quest_length,
        }
        yield Row(data, SUITE_SOURCE, i)
