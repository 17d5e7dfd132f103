"""The experiment table: per row the held-out score of every family and their average (means
± sample std over seeds × runs), the paired difference to the reference row with its standard
error over seeds, and the cost columns (docs/experiments.md).

Pairing: within a seed every row is evaluated on the same records under the same evaluation
tags, so row and reference are compared trajectory by trajectory (record, run). The difference
of a seed is the mean over families of the per-family mean paired difference (every family
weighs the same, as in the group average); the table reports the mean of the seeds'
differences and its standard error sd/√S — the seeds are the independent replications (each
trains its own policy), the trajectories within a seed are not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from evosteer_core.episode.records import FAMILIES
from evosteer_core.evaluation.costs import TokenCost, cost_markdown, table_cost
from evosteer_core.evaluation.tables import EvalTable, markdown_table, summarize

COST_COLUMNS = {
    "eval_tokens_per_problem": "tokens / problem (eval)",
    "update_ms_per_episode": "update ms / episode",
    "train_tokens_per_problem": "tokens / problem (train)",
}
"""Cost figures a row may carry, with their column titles (Fig. 6a's cost columns)."""


@dataclass(frozen=True)
class Difference:
    """Mean paired difference (row − reference) over seeds, its standard error, the seeds,
    and each seed's difference (in seed order: what the mean and SE are computed from, so a
    reader can check them or pool seeds of several experiments)."""

    mean: float
    se: float
    seeds: int
    per_seed: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, float | int | list[float] | None]:
        """JSON-ready: an undefined standard error (one seed) is None."""
        return {
            "mean": self.mean,
            "se": None if math.isnan(self.se) else self.se,
            "seeds": self.seeds,
            "per_seed": list(self.per_seed),
        }

    def text(self) -> str:
        se = "n/a" if math.isnan(self.se) else f"{100 * self.se:.2f}"
        return f"{100 * self.mean:+.2f} ± {se}"


@dataclass(frozen=True)
class RowResult:
    """One row: its scores, its difference to the reference (None for the reference)."""

    name: str
    evaluation: str
    table: EvalTable
    difference: Difference | None
    costs: dict[str, float] = field(default_factory=dict)
    tokens: TokenCost | None = None
    """The per-item token cost over every (seed, run, record) of the row (None: a cell
    stored before the table kept input and output tokens)."""
    seed_means: tuple[float, ...] = ()
    """Each seed's held-out mean (:func:`seed_mean`), in the table's seed order."""


def family_run_means(frames: Sequence[pd.DataFrame]) -> dict[str, list[float]]:
    """Family → the mean reward of each (seed, run) of the row, families in suite order."""
    out: dict[str, list[float]] = {}
    for family in FAMILIES:
        values = [
            float(g["reward"].mean())
            for frame in frames
            for _, g in frame[frame["family"] == family].groupby("run", sort=True)
        ]
        if values:
            out[family] = values
    return out


def cell_metrics(trajectories: pd.DataFrame) -> dict[str, float]:
    """One cell's headline figures (MLflow metrics of its child run): every family's mean
    reward and their average."""
    families = trajectories.groupby("family")["reward"].mean()
    return {
        **{f"heldout.{k}": float(v) for k, v in families.items()},
        "heldout.mean": float(families.mean()),
    }


def seed_mean(trajectories: pd.DataFrame) -> float:
    """One cell's held-out mean: the average of its families' mean rewards (every family
    weighs the same, as in the paired difference)."""
    return cell_metrics(trajectories)["heldout.mean"]


def seed_difference(row: pd.DataFrame, reference: pd.DataFrame) -> float:
    """One seed's paired difference: per family the mean of reward − reference reward over
    the shared (record, run) pairs, averaged over families."""
    pairs = row.merge(
        reference, on=["record_id", "run"], suffixes=("", "_ref"), validate="one_to_one"
    )
    if len(pairs) != len(row) or len(pairs) != len(reference):
        raise ValueError("a row and the reference were not evaluated on the same trajectories")
    per_family = (pairs["reward"] - pairs["reward_ref"]).groupby(pairs["family"]).mean()
    return float(per_family.mean())


def paired_difference(
    row: Mapping[int, pd.DataFrame], reference: Mapping[int, pd.DataFrame]
) -> Difference:
    """Mean over seeds of :func:`seed_difference` and its standard error (sample sd / √S;
    NaN with one seed)."""
    seeds = sorted(row)
    if seeds != sorted(reference):
        raise ValueError(f"seeds differ: row {seeds}, reference {sorted(reference)}")
    diffs = tuple(seed_difference(row[s], reference[s]) for s in seeds)
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return Difference(mean, math.nan, n, diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    return Difference(mean, sd / math.sqrt(n), n, diffs)


@dataclass(frozen=True)
class ExperimentTable:
    """Every row's result; ``reference`` names the row the differences are against."""

    rows: tuple[RowResult, ...]
    reference: str
    seeds: tuple[int, ...]
    runs: int
    simulated: bool

    def families(self) -> list[str]:
        return [s.name for s in self.rows[0].table.benchmarks]

    def cost_keys(self) -> list[str]:
        return [k for k in COST_COLUMNS if any(k in r.costs for r in self.rows)]

    def header(self) -> list[str]:
        groups = [g.name for g in self.rows[0].table.groups]
        costs = [COST_COLUMNS[k] for k in self.cost_keys()]
        return ["row", *self.families(), *groups, f"Δ vs {self.reference} ± SE", *costs]

    def cells(self, row: RowResult) -> list[str]:
        scores = [f"{100 * s.mean:.1f} ± {100 * s.std:.1f}" for s in row.table.benchmarks]
        groups = [f"{100 * g.mean:.1f} ± {100 * g.std:.1f}" for g in row.table.groups]
        diff = "(reference)" if row.difference is None else row.difference.text()
        costs = [f"{row.costs[k]:.1f}" if k in row.costs else "–" for k in self.cost_keys()]
        return [row.name, *scores, *groups, diff, *costs]

    def seed_header(self) -> list[str]:
        return ["row", *(f"seed {s}" for s in self.seeds)]

    def seed_cells(self, row: RowResult) -> list[str]:
        """Each seed's held-out mean (%), and a row's paired difference to the reference."""
        if row.difference is None:
            return [row.name, *(f"{100 * m:.2f}" for m in row.seed_means)]
        pairs = zip(row.seed_means, row.difference.per_seed, strict=True)
        return [row.name, *(f"{100 * m:.2f} (Δ {100 * d:+.2f})" for m, d in pairs)]

    def seed_caption(self) -> str:
        return (
            "Per seed: each cell's held-out mean reward (%, the average of its family means) "
            f"and, in brackets, its paired difference to {self.reference} (the values the "
            "Δ column's mean and standard error are computed from)."
        )

    def markdown(self) -> str:
        """The table as GitHub markdown, with a line saying what the numbers are, then the
        per-seed values and the token costs."""
        seeds = [
            "",
            self.seed_caption(),
            "",
            markdown_table(self.seed_header(), [self.seed_cells(r) for r in self.rows]),
        ]
        costs = [r.tokens for r in self.rows if r.tokens is not None]
        cost = ["", COST_CAPTION, "", cost_markdown(costs)] if costs else []
        main = markdown_table(self.header(), [self.cells(r) for r in self.rows])
        return "\n".join([self.caption(), "", main, *seeds, *cost])

    def caption(self) -> str:
        sim = "SIMULATED executor. " if self.simulated else ""
        return (
            f"{sim}Held-out mean reward (%) ± sample std over {len(self.seeds)} seeds × "
            f"{self.runs} runs; Δ = paired difference to {self.reference} (mean over seeds "
            f"{', '.join(map(str, self.seeds))}) ± its standard error over seeds."
        )

    def to_dict(self) -> dict:
        return {
            "reference": self.reference,
            "seeds": list(self.seeds),
            "runs": self.runs,
            "simulated": self.simulated,
            "rows": [
                {
                    "name": r.name,
                    "eval": r.evaluation,
                    **r.table.to_dict(),
                    "difference": None if r.difference is None else r.difference.to_dict(),
                    "seed_means": list(r.seed_means),
                    "costs": dict(r.costs),
                    "tokens": None if r.tokens is None else r.tokens.to_dict(),
                }
                for r in self.rows
            ],
        }


def experiment_table(
    rows: Sequence[tuple[str, str]],
    trajectories: Mapping[tuple[str, int], pd.DataFrame],
    reference: str,
    runs: int,
    simulated: bool,
    costs: Mapping[tuple[str, int], Mapping[str, float]] | None = None,
) -> ExperimentTable:
    """The table of ``rows`` ((name, eval) in order) from every cell's trajectories, keyed
    (row name, seed); cost figures per cell are averaged over the row's seeds."""
    seeds = tuple(sorted({seed for _, seed in trajectories}))
    by_row = {name: {seed: trajectories[(name, seed)] for seed in seeds} for name, _ in rows}
    results = []
    for name, evaluation in rows:
        frames = by_row[name]
        table = summarize(family_run_means([frames[s] for s in seeds]))
        difference = None if name == reference else paired_difference(frames, by_row[reference])
        row_costs = _mean_costs([dict((costs or {}).get((name, s), {})) for s in seeds])
        row_costs["eval_tokens_per_problem"] = sum(
            float(frames[s]["tokens"].mean()) for s in seeds
        ) / len(seeds)
        means = tuple(seed_mean(frames[s]) for s in seeds)
        tokens = _row_tokens(name, frames)
        results.append(RowResult(name, evaluation, table, difference, row_costs, tokens, means))
    return ExperimentTable(tuple(results), reference, seeds, runs, simulated)


def _mean_costs(per_seed: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = [k for k in COST_COLUMNS if per_seed and all(k in c for c in per_seed)]
    return {k: sum(c[k] for c in per_seed) / len(per_seed) for k in keys}


COST_CAPTION = (
    "Tokens per item at evaluation (every held-out trajectory of every seed and run; input and "
    "output of every model call, the orchestrator's or director's included): mean total, input "
    "and output, and of the totals P90, max, sample std and CV = std / mean."
)


def _row_tokens(name: str, frames: Mapping[int, pd.DataFrame]) -> TokenCost | None:
    """The per-item cost of the row over all its seeds (``evaluation/costs.py``)."""
    table = pd.concat([frames[s] for s in sorted(frames)], ignore_index=True)
    if not {"tokens_in", "tokens_out"} <= set(table.columns):
        return None
    return table_cost(name, table)
