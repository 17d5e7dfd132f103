"""HTML report of a training run, read from its run index (no MLflow needed).

Plots (PNG, inlined as base64): the learning curve under θ and ρ, the AnchorTB loss against
its anchor-only level, the skill lifecycle (candidate / validated / retired counts per step)
and the alpha spent. The sim executor's results are labelled simulated.
"""

from __future__ import annotations

import base64
import html
import io

import pandas as pd

from evosteer_core.infra.artifacts import ArtifactStore, RunIndex
from evosteer_core.pipeline.stage_io import StepStore, step_metrics

PLOTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Learning curve: mean reward under π_θ and ρ", ("reward_theta", "reward_rho")),
    ("AnchorTB loss vs the anchor-only level", ("loss", "anchor_only_loss")),
    ("Skill lifecycle", ("skills_candidate", "skills_validated", "skills_retired")),
    ("Alpha spent", ("alpha_spent",)),
)


def run_history(store: ArtifactStore, run_id: str) -> pd.DataFrame:
    """One row per recorded step (≥ 1) with every metric the step's artifacts hold."""
    index = RunIndex(store, run_id)
    io_ = StepStore(store)
    rows = []
    for step in index.steps():
        refs = index.step_artifacts(step)
        if step >= 1 and {"value", "update", "skills"} <= refs.keys():
            rows.append({"step": step, **step_metrics(io_, refs)})
    if not rows:
        raise LookupError(f"run {run_id} has no completed steps in {store.root}")
    return pd.DataFrame(rows).set_index("step")


def _plot(history: pd.DataFrame, title: str, columns: tuple[str, ...]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    for col in columns:
        if col in history:
            ax.plot(history.index, history[col], marker="o", markersize=3, label=col)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def render_html(history: pd.DataFrame, run_id: str, simulated: bool) -> str:
    """A self-contained HTML page: the four plots and the metrics table."""
    label = " (SIMULATED executor)" if simulated else ""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>EvoSteer run {html.escape(run_id)}</title></head><body>",
        f"<h1>EvoSteer run {html.escape(run_id)}{label}</h1>",
        f"<p>{len(history)} steps.</p>",
    ]
    for title, cols in PLOTS:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(
            f"<img alt='{html.escape(title)}' src='data:image/png;base64,{_plot(history, title, cols)}'>"
        )
    parts.append("<h2>Metrics per step</h2>")
    parts.append(history.to_html(float_format=lambda x: f"{x:.4g}"))
    parts.append("</body></html>")
    return "\n".join(parts)
