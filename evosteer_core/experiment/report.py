"""The experiment's stored outputs: the table as JSON, markdown and a self-contained HTML page
(the table and a plot of every row's paired difference with its standard error)."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from evosteer_core.evaluation.costs import COST_HEADER, cost_cells
from evosteer_core.experiment.cells import experiment_of
from evosteer_core.experiment.table import COST_CAPTION, ExperimentTable, experiment_table
from evosteer_core.infra.artifacts import ArtifactRef, put_json
from evosteer_core.infra.config import RunConfig
from evosteer_core.pipeline.stage_io import StepStore


@dataclass(frozen=True)
class StoredExperiment:
    """The stored JSON table (``ref``) and its markdown and HTML renderings."""

    ref: ArtifactRef
    markdown: str
    html: str
    table: ExperimentTable


def build_table(
    cfg: RunConfig,
    io_: StepStore,
    cells: Sequence[ArtifactRef],
    costs: Sequence[dict[str, float]],
) -> ExperimentTable:
    """The table from every cell's trajectories, ``cells`` in row-major (row, seed) order."""
    exp = experiment_of(cfg)
    keys = [(row.name, seed) for row in exp.rows for seed in exp.seeds]
    if len(cells) != len(keys) or len(costs) != len(keys):
        raise ValueError(f"{len(cells)} cells for {len(keys)} (row, seed) pairs")
    return experiment_table(
        [(row.name, row.eval) for row in exp.rows],
        {key: io_.get_table(ref) for key, ref in zip(keys, cells, strict=True)},
        exp.reference_row.name,
        exp.runs,
        cfg.executor.kind == "sim",
        dict(zip(keys, costs, strict=True)),
    )


def store_experiment(
    cfg: RunConfig,
    io_: StepStore,
    cells: Sequence[ArtifactRef],
    costs: Sequence[dict[str, float]],
) -> StoredExperiment:
    """Build the table, store it as JSON (with the markdown and the cells' refs) and render."""
    table = build_table(cfg, io_, cells, costs)
    markdown = table.markdown()
    page = render_html(table, cfg.name)
    page_ref = io_.store.put_bytes(page.encode(), "experiment.html")
    payload = {
        **table.to_dict(),
        "markdown": markdown,
        "html": {"uri": page_ref.uri, "sha256": page_ref.sha256},
        "cells": [c.sha256 for c in cells],
    }
    ref = put_json(io_.store, payload, "experiment.json")
    return StoredExperiment(ref, markdown, page, table)


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1f2328; }
h1 { font-size: 1.4rem; } p.caption { color: #57606a; max-width: 60rem; }
div.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9rem; white-space: nowrap; }
th, td { border: 1px solid #d0d7de; padding: 0.3rem 0.6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f6f8fa; position: sticky; top: 0; }
tr.reference td { font-weight: 600; background: #fff8c5; }
"""


def render_html(table: ExperimentTable, name: str) -> str:
    """A self-contained page (inline style, the plot as an embedded PNG; nothing fetched)."""
    classes = ["reference" if r.difference is None else "row" for r in table.rows]
    main = html_table("experiment-table", table.header(), map(table.cells, table.rows), classes)
    seeds = html_table("seed-table", table.seed_header(), map(table.seed_cells, table.rows))
    title = f"Experiment {html.escape(name)}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{STYLE}</style></head><body><h1>{title}</h1>"
        f"<p class='caption'>{html.escape(table.caption())}</p>{main}"
        f"<h2>Per seed</h2><p class='caption'>{html.escape(table.seed_caption())}</p>{seeds}"
        f"{cost_html(table)}"
        f"<h2>Paired difference to {html.escape(table.reference)}</h2>"
        f"<img id='difference-plot' alt='paired differences' src='data:image/png;base64,"
        f"{difference_plot(table)}'></body></html>"
    )


def html_table(
    table_id: str,
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    classes: Sequence[str] | None = None,
) -> str:
    """A scrollable HTML table, every cell escaped; ``classes`` gives each row a class."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        (f'<tr class="{classes[i]}">' if classes else "<tr>")
        + "".join(f"<td>{html.escape(c)}</td>" for c in row)
        + "</tr>"
        for i, row in enumerate(rows)
    )
    return (
        f"<div class='scroll'><table id='{table_id}'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def cost_html(table: ExperimentTable) -> str:
    """The per-item token cost table (empty when no row has one)."""
    costs = [r.tokens for r in table.rows if r.tokens is not None]
    if not costs:
        return ""
    return (
        f"<h2>Tokens per item</h2><p class='caption'>{html.escape(COST_CAPTION)}</p>"
        + html_table("cost-table", COST_HEADER, map(cost_cells, costs))
    )


def difference_plot(table: ExperimentTable) -> str:
    """Horizontal bars: every row's paired difference to the reference (percentage points)
    with ±1 standard error; base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in table.rows if r.difference is not None]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    means = [100 * r.difference.mean for r in rows]
    errors = [0.0 if r.difference.se != r.difference.se else 100 * r.difference.se for r in rows]
    colors = ["#2da44e" if m >= 0 else "#cf222e" for m in means]
    ax.barh(range(len(rows)), means, xerr=errors, color=colors, capsize=3)
    ax.set_yticks(range(len(rows)), [r.name for r in rows])
    ax.invert_yaxis()
    ax.axvline(0, color="#57606a", linewidth=1)
    ax.set_xlabel(f"held-out reward − {table.reference} (points; ±1 SE over seeds)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()
