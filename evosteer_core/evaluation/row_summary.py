"""The comparison table of several evaluation rows (docs/paradigms.md): per row the score
table of ``tables.summarize`` (5-run means ± sample std, group averages) and the token cost
per item, over all benchmarks together and per benchmark."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from evosteer_core.evaluation.costs import TokenCost, cost_markdown, table_cost
from evosteer_core.evaluation.rows import run_means
from evosteer_core.evaluation.tables import summarize


def summarize_rows(tables: Mapping[str, Mapping[str, pd.DataFrame]]) -> dict[str, Any]:
    """Row → benchmark → row table ⇒ a JSON-able summary, rows and benchmarks in the order
    given: ``{"rows": [{"row", "benchmarks", "groups", "cost", "cost_by_benchmark"}]}``."""
    out = []
    for row, by_bench in tables.items():
        scores = summarize({b: run_means(t) for b, t in by_bench.items()})
        every = pd.concat(list(by_bench.values()), ignore_index=True)
        out.append(
            {
                "row": row,
                **scores.to_dict(),
                "cost": table_cost(row, every).to_dict(),
                "cost_by_benchmark": {b: table_cost(b, t).to_dict() for b, t in by_bench.items()},
            }
        )
    return {"rows": out}


def scores_markdown(summary: Mapping[str, Any]) -> str:
    """One line per row, one column per benchmark and complete group: mean ± std in %."""
    rows: Sequence[Mapping[str, Any]] = summary["rows"]
    names = [s["name"] for s in rows[0]["benchmarks"] + rows[0]["groups"]]
    lines = ["| row | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in rows:
        cells = {s["name"]: s for s in r["benchmarks"] + r["groups"]}
        text = [
            f"{100 * cells[n]['mean']:.2f} ± {100 * cells[n]['std']:.2f}" if n in cells else "-"
            for n in names
        ]
        lines.append(f"| {r['row']} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def costs_markdown(summary: Mapping[str, Any]) -> str:
    """The token cost table of every row (all benchmarks together)."""
    return cost_markdown([TokenCost(**r["cost"]) for r in summary["rows"]])


def row_metrics(summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Row → its MLflow metrics: ``eval.<bench>.mean``/``.std`` for the ``checkpoint`` row
    (the names a plain evaluation logs) and ``eval.<row>.<bench>.…`` for the others (``:`` →
    ``.``), plus ``….tokens_per_item`` (the mean total tokens per item)."""
    out: dict[str, dict[str, float]] = {}
    for r in summary["rows"]:
        prefix = "eval." if r["row"] == "checkpoint" else f"eval.{r['row'].replace(':', '.')}."
        metrics: dict[str, float] = {}
        for s in r["benchmarks"] + r["groups"]:
            key = prefix + s["name"].replace(" ", "_")
            metrics.update({f"{key}.mean": s["mean"], f"{key}.std": s["std"]})
        metrics[f"{prefix}tokens_per_item"] = r["cost"]["mean_total"]
        out[r["row"]] = metrics
    return out
