"""Benchmarks: task-table schema, JSONL loaders, IID/OOD task-type map, metrics, rewards."""

from evosteer_core.benchmarks.loaders import CONVERTERS, load_benchmark
from evosteer_core.benchmarks.rewards import evaluate, f1
from evosteer_core.benchmarks.rows import BenchmarkDataError
from evosteer_core.benchmarks.schema import (
    TASK_SCHEMA,
    frame_to_records,
    read_task_table,
    records_to_frame,
    write_task_table,
)
from evosteer_core.benchmarks.taskmap import benchmarks_in, family_of, group_of

__all__ = [
    "CONVERTERS",
    "TASK_SCHEMA",
    "BenchmarkDataError",
    "benchmarks_in",
    "evaluate",
    "f1",
    "family_of",
    "frame_to_records",
    "group_of",
    "load_benchmark",
    "read_task_table",
    "records_to_frame",
    "write_task_table",
]
