"""Evaluation tables (docs/method.md §1.10): per benchmark the mean over runs with the sample std, and
per group the average of the benchmark means with the group std sqrt(Σ σ_b²) / n.

A group enters the table only when every one of its benchmarks was evaluated (a partial group
average is not the paper's number); on the simulated suite the six families are the IID
benchmarks, so the IID group is complete and the OOD group is absent. A known benchmark that
is in none of the method's groups (HumanEval or TextWorld under EvoSteer) is reported under
its own name and enters no group average; a name that is no benchmark at all fails.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evosteer_core.benchmarks.taskmap import GROUPS, benchmarks_in, family_of

RUNS = 5
"""Every reported score is a mean over five runs (docs/method.md §1.10)."""


@dataclass(frozen=True)
class Score:
    """Mean and sample standard deviation (ddof 1) of one benchmark's or group's scores."""

    name: str
    mean: float
    std: float
    n: int

    def __str__(self) -> str:
        return f"{self.name}: {100 * self.mean:.2f} ± {100 * self.std:.2f} (n={self.n})"


@dataclass(frozen=True)
class EvalTable:
    benchmarks: tuple[Score, ...]
    groups: tuple[Score, ...]

    def to_dict(self) -> dict[str, list[dict[str, float | int | str]]]:
        return {
            "benchmarks": [vars(s).copy() for s in self.benchmarks],
            "groups": [vars(s).copy() for s in self.groups],
        }

    def markdown(self) -> str:
        lines = ["| benchmark | mean | std | runs |", "| --- | --- | --- | --- |"]
        for s in (*self.benchmarks, *self.groups):
            lines.append(f"| {s.name} | {100 * s.mean:.2f} | {100 * s.std:.2f} | {s.n} |")
        return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table of ``rows`` under ``header``."""
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    return "\n".join(lines)


def benchmark_score(name: str, runs: Sequence[float]) -> Score:
    """Mean over runs with the sample std (0 for a single run)."""
    if not runs:
        raise ValueError(f"benchmark {name!r} has no runs")
    n = len(runs)
    mean = sum(runs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in runs) / (n - 1)) if n > 1 else 0.0
    return Score(name, mean, std, n)


def group_score(group: str, scores: Sequence[Score]) -> Score:
    """Average of benchmark means; group std sqrt(Σ σ_b²) / n (docs/method.md §1.10)."""
    n = len(scores)
    mean = sum(s.mean for s in scores) / n
    std = math.sqrt(sum(s.std**2 for s in scores)) / n
    return Score(f"{group} avg", mean, std, n)


def summarize(runs: Mapping[str, Sequence[float]], method: str = "evosteer") -> EvalTable:
    """Benchmark name → per-run scores ⇒ the table with every complete group's average;
    a benchmark outside the method's groups is a row of its own, in no group."""
    bench = tuple(benchmark_score(name, vals) for name, vals in runs.items())
    by_name = {s.name: s for s in bench}
    for name in by_name:
        family_of(name)  # a name that is no benchmark fails here, listing the known ones
    groups = tuple(
        group_score(g, [by_name[b] for b in benchmarks_in(g, method)])
        for g in GROUPS[method]
        if all(b in by_name for b in benchmarks_in(g, method))
    )
    return EvalTable(bench, groups)
