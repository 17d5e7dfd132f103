"""The task-record table schema: round trip and rejection of bad tables with readable errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from evosteer_core.benchmarks.schema import (
    COLUMNS,
    frame_to_records,
    read_task_table,
    records_to_frame,
    validate_frame,
    write_task_table,
)
from evosteer_core.episode.records import TaskRecord

RECORDS = [
    TaskRecord("q1", "hotpotqa", "hotpotqa", "Who?", "qa_em", answers=("Ann", "Anne")),
    TaskRecord(
        "m1", "medqa", "medqa", "Which?", "mcq", answers=("B",), choices=("x", "y"), meta={"k": 1}
    ),
    TaskRecord("a1", "aime", "aime", "Find n.", "aime", answers=("33",)),
    TaskRecord(
        "c1", "mbpp_plus", "mbpp_plus", "Write f.", "code", tests="assert f()", entry_point="f"
    ),
    TaskRecord("i1", "alfworld", "alfworld", "Your task is to: x", "interactive"),
]


def test_round_trip_preserves_records() -> None:
    frame = records_to_frame(RECORDS)
    assert list(frame.columns) == list(COLUMNS)
    assert frame.loc[1, "choices"] == ["x", "y"]
    back = frame_to_records(frame)
    assert back == RECORDS
    assert [r.meta for r in back] == [r.meta for r in RECORDS]
    assert isinstance(back[0].answers, tuple)


def _frame() -> pd.DataFrame:
    return records_to_frame(RECORDS).copy()


def _expect_failure(frame: pd.DataFrame, *fragments: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_frame(frame)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_duplicate_id_rejected() -> None:
    frame = _frame()
    frame.loc[2, "record_id"] = "q1"
    _expect_failure(frame, "column 'record_id'", "field_uniqueness", "'q1'")


def test_unknown_family_and_metric_rejected() -> None:
    frame = _frame()
    frame.loc[0, "family"] = "squad"
    frame.loc[1, "metric"] = "bleu"
    _expect_failure(frame, "column 'family'", "'q1'", "column 'metric'", "'m1'")


def test_empty_prompt_rejected() -> None:
    frame = _frame()
    frame.loc[3, "prompt"] = "  "
    _expect_failure(frame, "column 'prompt'", "non-empty prompt", "'c1'")


@pytest.mark.parametrize(
    ("row", "column", "value"),
    [
        (1, "answers", ["E"]),  # letter beyond the two choices
        (1, "choices", ["only one"]),
        (2, "answers", ["1000"]),  # AIME range
        (2, "answers", ["7", "8"]),
        (0, "answers", []),  # QA without gold
        (3, "tests", ""),
        (3, "entry_point", "not an identifier"),
    ],
)
def test_gold_must_fit_metric(row: int, column: str, value: object) -> None:
    frame = _frame()
    frame.at[row, column] = value
    _expect_failure(frame, "row rule", "gold fields fit the metric", repr(RECORDS[row].record_id))


def test_list_and_dict_columns_typed() -> None:
    frame = _frame()
    frame.at[0, "answers"] = "Ann"
    frame.at[4, "meta"] = ["not", "a", "dict"]
    _expect_failure(frame, "column 'answers'", "a list of non-empty strings", "column 'meta'")


def test_extra_column_rejected() -> None:
    frame = _frame()
    frame["gold_patch"] = ""
    with pytest.raises(ValueError, match="gold_patch"):
        validate_frame(frame)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_task_table_file_round_trip(tmp_path: Path, suffix: str) -> None:
    records = [
        *RECORDS,
        TaskRecord(
            "w1",
            "webshop",
            "alfworld",
            "Buy x",
            "interactive",
            meta={"price_upper": 40.0, "attributes": ["a"]},
        ),
    ]
    path = write_task_table(records, tmp_path / f"table{suffix}")
    back = read_task_table(path)
    assert back == records
    assert [r.meta for r in back] == [r.meta for r in records]


def test_task_table_file_validated(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    row = {c: "" for c in COLUMNS} | {
        "record_id": "x",
        "source": "s",
        "family": "aime",
        "prompt": "P",
        "metric": "aime",
        "answers": ["2000"],
        "choices": [],
        "meta": {},
    }
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="row rule: expected gold fields fit the metric.*'x'"):
        read_task_table(path)
    with pytest.raises(FileNotFoundError, match="task table not found"):
        read_task_table(tmp_path / "none.parquet")
