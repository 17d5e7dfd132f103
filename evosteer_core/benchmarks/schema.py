"""The task-record table: a pandera schema over the columns of :class:`TaskRecord`.

Benchmarks are stored and exchanged as tables (JSONL/parquet, Flyte dataframes); this schema
is the contract those tables meet. ``answers`` and ``choices`` are lists of strings in the
table (tuples on the record); ``meta`` is a JSON-able dict. Row rules tie the gold fields to
the metric, so a table that validates can be scored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pandera.pandas as pa

from evosteer_core.episode.records import FAMILIES, METRICS, TaskRecord

COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TaskRecord))
"""Table columns, in the order of the record's fields."""

CHOICE_LETTERS = "ABCDEFGHIJ"
"""Letters of multiple-choice options, in order (as ``TaskRecord.public_prompt`` shows them)."""


def _is_text_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value)


def _is_aime_integer(text: str) -> bool:
    return text.isdigit() and 0 <= int(text) <= 999


def _gold_matches_metric(frame: pd.DataFrame) -> pd.Series:
    """Row rule: each metric has the gold fields it scores against."""

    def ok(row: pd.Series) -> bool:
        answers, choices = row["answers"], row["choices"]
        if not isinstance(answers, list) or not isinstance(choices, list):
            return False  # the column checks report the type
        metric = row["metric"]
        if metric in ("qa_em", "math"):
            return len(answers) > 0
        if metric == "aime":
            return len(answers) == 1 and _is_aime_integer(answers[0])
        if metric == "mcq":
            letters = CHOICE_LETTERS[: len(choices)]
            return len(choices) >= 2 and len(answers) == 1 and answers[0] in letters
        if metric == "code":
            return bool(str(row["tests"]).strip()) and str(row["entry_point"]).isidentifier()
        return True  # interactive: the environment decides success

    return frame.apply(ok, axis=1).astype(bool)


def _nonempty(series: pd.Series) -> pd.Series:
    return series.str.strip().str.len() > 0


TASK_SCHEMA = pa.DataFrameSchema(
    {
        "record_id": pa.Column(str, pa.Check(_nonempty, error="non-empty id"), unique=True),
        "source": pa.Column(str, pa.Check(_nonempty, error="non-empty source")),
        "family": pa.Column(str, pa.Check.isin(FAMILIES)),
        "prompt": pa.Column(str, pa.Check(_nonempty, error="non-empty prompt")),
        "metric": pa.Column(str, pa.Check.isin(METRICS)),
        "answers": pa.Column(
            object,
            pa.Check(_is_text_list, element_wise=True, error="a list of non-empty strings"),
        ),
        "choices": pa.Column(
            object,
            pa.Check(_is_text_list, element_wise=True, error="a list of non-empty strings"),
        ),
        "tests": pa.Column(str),
        "entry_point": pa.Column(str),
        "meta": pa.Column(
            object, pa.Check(lambda v: isinstance(v, dict), element_wise=True, error="a dict")
        ),
    },
    checks=[
        pa.Check(
            _gold_matches_metric,
            error=(
                "gold fields fit the metric (qa_em/math: answers; aime: one integer 0-999; "
                "mcq: >=2 choices and one answer letter among them; code: tests and an "
                "identifier entry_point)"
            ),
        )
    ],
    strict=True,
    name="task_records",
)


class TaskTableError(ValueError):
    """A task table failed validation; ``labels`` are the index labels of the failing rows."""

    def __init__(self, message: str, labels: list) -> None:
        super().__init__(message)
        self.labels = labels


def validate_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Validate a task table; on failure raise :class:`TaskTableError` naming record ids and
    rules."""
    try:
        return TASK_SCHEMA.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        labels = list(dict.fromkeys(exc.failure_cases["index"].dropna()))
        raise TaskTableError(_describe_failures(frame, exc.failure_cases), labels) from None


def _describe_failures(frame: pd.DataFrame, cases: pd.DataFrame) -> str:
    lines = ["task table failed validation:"]
    cases = cases.assign(
        target=[
            f"column {col!r}" if ctx == "Column" else "row rule"
            for ctx, col in zip(cases["schema_context"], cases["column"], strict=True)
        ]
    )
    for (target, check), group in cases.groupby(["target", "check"], dropna=False, sort=False):
        rows = list(dict.fromkeys(group["index"].dropna()))
        if "record_id" in frame.columns and rows:
            where = ", ".join(repr(frame.at[label, "record_id"]) for label in rows[:5])
            where = f"records {where}" + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")
        else:
            shown = group["failure_case"].dropna().astype(str).unique()[:5]
            where = "; ".join(shown) or "table level"
        lines.append(f"  {target}: expected {check}: {where}")
    return "\n".join(lines)


def records_to_frame(records: Iterable[TaskRecord]) -> pd.DataFrame:
    """A validated task table with one row per record (tuples become lists)."""
    rows = [
        {
            **{name: getattr(r, name) for name in COLUMNS},
            "answers": list(r.answers),
            "choices": list(r.choices),
            "meta": dict(r.meta),
        }
        for r in records
    ]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for name in ("answers", "choices", "meta"):
        frame[name] = frame[name].astype(object)
    return validate_frame(frame)


def frame_to_records(frame: pd.DataFrame) -> list[TaskRecord]:
    """Validate a task table and turn its rows back into records (lists become tuples)."""
    frame = validate_frame(frame)
    return [
        TaskRecord(
            **{
                **row,
                "answers": tuple(row["answers"]),
                "choices": tuple(row["choices"]),
                "meta": dict(row["meta"]),
            }
        )
        for row in frame.to_dict("records")
    ]


def write_task_table(records: Iterable[TaskRecord], path: str | Path) -> Path:
    """Write records as a validated task table: ``.parquet``, or JSONL for any other suffix.

    Parquet stores ``meta`` as JSON text: its dicts differ per benchmark, which a columnar
    struct type cannot hold.
    """
    path = Path(path)
    frame = records_to_frame(records)
    if path.suffix == ".parquet":
        frame.assign(meta=frame["meta"].map(json.dumps)).to_parquet(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True, force_ascii=False)
    return path


def read_task_table(path: str | Path) -> list[TaskRecord]:
    """Read a task table written by :func:`write_task_table` (or by hand in this schema)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: task table not found")
    if path.suffix == ".parquet":
        frame = pd.read_parquet(path)
        for name in ("answers", "choices"):
            frame[name] = frame[name].map(list).astype(object)
        frame["meta"] = frame["meta"].map(json.loads).astype(object)
    else:
        frame = pd.read_json(path, orient="records", lines=True, dtype=False)
    return frame_to_records(frame)


def task_table_bytes(records: Iterable[TaskRecord]) -> bytes:
    """The validated task table as canonical JSON lines (one record a line, keys sorted): the
    bytes a benchmark is stored as, so equal records give equal hashes whatever file
    formatting they came from."""
    frame = records_to_frame(records)
    lines = [
        json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        for row in frame.to_dict("records")
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def records_from_table_bytes(data: bytes) -> list[TaskRecord]:
    """The records of :func:`task_table_bytes` output, validated again on the way in."""
    rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for name in ("answers", "choices", "meta"):
        frame[name] = frame[name].astype(object)
    return frame_to_records(frame)
