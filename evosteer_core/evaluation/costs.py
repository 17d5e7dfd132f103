"""Token cost per item (docs/paradigms.md, "Token cost"): the cost table of a row's
trajectories, one trajectory = one item attempted once.

Per row: the mean total, input and output tokens per item, and of the totals the 90th
percentile (linear interpolation between order statistics, the "inclusive" method), the
maximum, the sample standard deviation (ddof 1; 0 for one item) and the coefficient of
variation std / mean (0 when the mean is 0). Tokens are what the episode's ledger booked:
the orchestrator's decisions and every node execution (docs/method.md §1.3).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd

from evosteer_core.evaluation.tables import markdown_table


@dataclass(frozen=True)
class TokenCost:
    name: str
    n: int
    mean_total: float
    mean_input: float
    mean_output: float
    p90: float
    max: float
    std: float
    cv: float

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def token_cost(
    name: str, totals: Sequence[float], inputs: Sequence[float], outputs: Sequence[float]
) -> TokenCost:
    """The cost statistics of per-item token counts (equal-length sequences, at least one)."""
    n = len(totals)
    if n == 0 or len(inputs) != n or len(outputs) != n:
        raise ValueError(f"cost of {name!r}: need one total, input and output count per item")
    mean = statistics.fmean(totals)
    std = statistics.stdev(totals) if n > 1 else 0.0
    p90 = statistics.quantiles(totals, n=10, method="inclusive")[-1] if n > 1 else totals[0]
    return TokenCost(
        name=name,
        n=n,
        mean_total=mean,
        mean_input=statistics.fmean(inputs),
        mean_output=statistics.fmean(outputs),
        p90=float(p90),
        max=float(max(totals)),
        std=std,
        cv=std / mean if mean > 0 else 0.0,
    )


def table_cost(name: str, table: pd.DataFrame) -> TokenCost:
    """:func:`token_cost` of a row table's ``tokens``, ``tokens_in`` and ``tokens_out``."""
    return token_cost(
        name,
        [float(x) for x in table["tokens"]],
        [float(x) for x in table["tokens_in"]],
        [float(x) for x in table["tokens_out"]],
    )


COST_HEADER = ("row", "items", "mean total", "mean input", "mean output", "P90", "max", "std", "CV")


def cost_cells(c: TokenCost) -> list[str]:
    """One cost row as the table's text cells (in :data:`COST_HEADER` order)."""
    return [
        c.name, str(c.n), f"{c.mean_total:.1f}", f"{c.mean_input:.1f}", f"{c.mean_output:.1f}",
        f"{c.p90:.1f}", f"{c.max:.0f}", f"{c.std:.1f}", f"{c.cv:.3f}",
    ]  # fmt: skip


def cost_markdown(costs: Sequence[TokenCost]) -> str:
    return markdown_table(COST_HEADER, [cost_cells(c) for c in costs])
