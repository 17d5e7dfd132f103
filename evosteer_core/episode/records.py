"""Task records: one benchmark item, whatever its source, in one shape."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

FAMILIES: tuple[str, ...] = ("hotpotqa", "nq_open", "medqa", "aime", "mbpp_plus", "alfworld")
"""The six IID task types (families); every record belongs to one of them."""

METRICS: tuple[str, ...] = ("qa_em", "mcq", "aime", "math", "code", "interactive")
"""Reward functions a record can name (see ``benchmarks.metrics``)."""


SIM_TAG = re.compile(r"^\[sim [a-z_]+ [A-Za-z0-9_]+ #\d+\] ")
"""The bookkeeping tag that starts a simulated task's prompt (``[sim hotpotqa train #3] ``):
it names the record's split and index, which no real task shows."""


def sim_tag(family: str, split: str, index: int) -> str:
    """The tag of simulated record ``index`` of ``family`` in ``split`` (matches ``SIM_TAG``
    once followed by a space)."""
    return f"[sim {family} {split} #{index}]"


@dataclass(frozen=True)
class TaskRecord:
    """One task. ``answers`` are gold aliases; code records carry ``tests``/``entry_point``.

    ``meta`` holds JSON-able extras (the sim suite keeps its latent task parameters there).
    The gold fields are never shown to an executor: ``public_prompt`` is what agents see.
    """

    record_id: str
    source: str
    family: str
    prompt: str
    metric: str
    answers: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    tests: str = ""
    entry_point: str = ""
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"record {self.record_id!r}: family {self.family!r} not in {FAMILIES}")
        if self.metric not in METRICS:
            raise ValueError(f"record {self.record_id!r}: metric {self.metric!r} not in {METRICS}")

    @property
    def public_prompt(self) -> str:
        """The task text an agent sees: the prompt plus lettered choices for MCQ."""
        if not self.choices:
            return self.prompt
        letters = "ABCDEFGHIJ"
        lines = [f"{letters[i]}. {c}" for i, c in enumerate(self.choices)]
        return self.prompt + "\n" + "\n".join(lines)

    @property
    def orchestrator_text(self) -> str:
        """The task as the orchestrator sees it: the public prompt without a simulated task's
        tag (``SIM_TAG``), so that, like a real orchestrator, it reads the task's text and
        family but never a record id, index or split name."""
        return SIM_TAG.sub("", self.public_prompt, count=1)
