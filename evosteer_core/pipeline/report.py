"""HTML report of a training run, read from its run index (no MLflow needed).

One self-contained page (inline stylesheet, plots as SVG data URIs, no script and nothing
fetched, so it opens offline): the run's identity and hashes, the code that ran it, its MLflow
run, the command that replays a step, the plots — the learning curve under θ and ρ, the
AnchorTB loss against its anchor-only level, the skill lifecycle (candidate / validated /
retired counts per step) and the alpha spent —, the metrics and artifact hashes per step and
the recorded config. The sim executor's results are labelled simulated. :func:`figures_html`
draws the plots; the Flyte tasks that produce the numbers show the same figures as a Deck
(:func:`deck_html`, :func:`evaluation_deck_html`).
"""

from __future__ import annotations

import base64
import html
import io
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from evosteer_core.infra.artifacts import ArtifactStore, RunIndex
from evosteer_core.infra.provenance import (
    CACHE_VERSION_KEY,
    CODE_HASH_TAG,
    EVALUATION_CACHE_VERSION_KEY,
    GIT_COMMIT_TAG,
    GIT_DIRTY_TAG,
    VERSION_TAG,
    code_summary,
)
from evosteer_core.infra.runs import CONFIG_ENTRY, config_hash, run_config, run_provenance
from evosteer_core.pipeline.stage_io import METHODS, StepStore, step_metrics

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from evosteer_core.evaluation.tables import EvalTable
    from evosteer_core.infra.config import RunConfig

PLOTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Learning curve: mean reward under π_θ and ρ", ("reward_theta", "reward_rho")),
    ("AnchorTB loss vs the anchor-only level", ("loss", "anchor_only_loss")),
    ("Skill lifecycle", ("skills_candidate", "skills_validated", "skills_retired")),
    ("Alpha spent", ("alpha_spent",)),
)

SERIES_STYLES: tuple[dict[str, object], ...] = (
    {"color": "#0072B2", "marker": "o", "linestyle": "-", "markersize": 6},
    {"color": "#D55E00", "marker": "s", "linestyle": "--", "markersize": 5},
    {"color": "#009E73", "marker": "^", "linestyle": ":", "markersize": 6},
)
"""One style per series of a plot (Okabe–Ito colours): each differs in colour, marker and line
pattern, later ones are drawn with hollow markers on top, so a series that lies exactly on
another stays visible."""

CODE_FIELDS: tuple[tuple[str, str], ...] = (
    (VERSION_TAG, "package version"),
    (CACHE_VERSION_KEY, "cache version"),
    (EVALUATION_CACHE_VERSION_KEY, "evaluation cache version"),
    (CODE_HASH_TAG, "code hash"),
    (GIT_COMMIT_TAG, "git commit"),
    (GIT_DIRTY_TAG, "uncommitted changes"),
)

STYLE = """
:root { --fg:#1d2430; --muted:#5b6676; --line:#d9dee5; --bg:#f6f8fa; --card:#fff;
  --accent:#0b62a4; --warn-bg:#fff4d6; --warn-fg:#7a4b00; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; }
main { max-width:1180px; margin:0 auto; padding:24px 20px 48px; }
header.top { display:flex; flex-wrap:wrap; align-items:center; gap:12px; margin-bottom:6px; }
h1 { font-size:1.6rem; margin:0; word-break:break-all; }
h2 { font-size:1.15rem; margin:0 0 12px; }
nav { margin:8px 0 20px; display:flex; flex-wrap:wrap; gap:6px 16px; font-size:.9rem; }
a { color:var(--accent); }
.badge { display:inline-block; padding:2px 10px; border-radius:999px; font-size:.8rem;
  font-weight:600; letter-spacing:.03em; background:#e6f0fa; color:var(--accent); }
.badge.sim { background:var(--warn-bg); color:var(--warn-fg); }
section.card { background:var(--card); border:1px solid var(--line); border-radius:10px;
  padding:16px 18px; margin:0 0 18px; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(460px,1fr)); gap:18px;
  margin-bottom:18px; }
.cards > section.card { margin:0; }
.cards > section.wide { grid-column:1 / -1; }
dl.kv { display:grid; grid-template-columns:max-content 1fr; gap:4px 16px; margin:0; }
dl.kv dt { color:var(--muted); }
dl.kv dd { margin:0; min-width:0; overflow-wrap:anywhere; }
code, pre, .mono { font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,"DejaVu Sans Mono",monospace;
  font-size:.85rem; }
pre { background:#f0f3f6; border:1px solid var(--line); border-radius:6px; padding:10px 12px;
  margin:6px 0 0; overflow-x:auto; white-space:pre; }
pre.cmd { white-space:pre-wrap; overflow-wrap:anywhere; }
pre.config { max-height:520px; overflow:auto; }
p.note { color:var(--muted); margin:6px 0 0; font-size:.88rem; }
.figures { display:grid; grid-template-columns:repeat(auto-fit,minmax(440px,1fr)); gap:14px; }
figure { margin:0; border:1px solid var(--line); border-radius:8px; padding:8px; background:#fff; }
figure img { display:block; width:100%; height:auto; }
figcaption { font-size:.85rem; color:var(--muted); padding:4px 4px 0; }
.table-scroll { overflow-x:auto; max-width:100%; border:1px solid var(--line); border-radius:6px; }
table.data { border-collapse:collapse; font-size:.85rem; white-space:nowrap; }
table.data th, table.data td { padding:4px 10px; border-bottom:1px solid var(--line);
  text-align:right; }
table.data thead th { background:#eef2f6; position:sticky; top:0; }
table.data th:first-child, table.data td:first-child { position:sticky; left:0;
  background:#f7f9fb; text-align:left; }
table.data tbody tr:nth-child(even) td { background:#fafbfc; }
table.data tbody tr:nth-child(even) td:first-child { background:#f2f5f8; }
table.hashes td { font-family:ui-monospace,Menlo,Consolas,"DejaVu Sans Mono",monospace; }
table.hashes th, table.hashes td { text-align:left; }
details summary { cursor:pointer; color:var(--accent); }
"""


@dataclass(frozen=True)
class RunReport:
    """What the report shows of one run, read from its store."""

    run_id: str
    store_root: str
    config: RunConfig
    history: pd.DataFrame
    hashes: pd.DataFrame
    recorded: dict | None
    """The latest execution's provenance (``runs.record_provenance``); None before it existed."""
    config_yaml: str
    """The config as stored at step 0 (``runs.record_config``: credentials redacted)."""
    config_sha256: str
    """That object's sha256 (the step-0 ``config`` entry)."""


def run_history(store: ArtifactStore, run_id: str) -> pd.DataFrame:
    """One row per recorded step (≥ 1) with every metric the step's artifacts hold (each
    step's read once a process: ``stage_io.STEP_METRICS``; the training Deck redraws every
    step so far every few steps)."""
    index = RunIndex(store, run_id)
    io_ = StepStore(store)
    rows = []
    for step in index.steps():
        refs = index.step_artifacts(step)
        if step >= 1 and any(set(m.artifacts) <= refs.keys() for m in METHODS.values()):
            rows.append({"step": step, **step_metrics(io_, refs)})
    if not rows:
        raise LookupError(f"run {run_id} has no completed steps in {store.root}")
    return pd.DataFrame(rows).set_index("step")


def artifact_hashes(store: ArtifactStore, run_id: str) -> pd.DataFrame:
    """sha256 of every step artifact of the run's method (``stage_io.METHODS``) per recorded
    step, '—' where a step lacks one (step 0 holds only the initial state)."""
    index = RunIndex(store, run_id)
    steps = {step: index.step_artifacts(step) for step in index.steps()}
    recorded = set().union(*steps.values())
    names = next(
        (m.artifacts for m in METHODS.values() if set(m.artifacts) <= recorded),
        METHODS["evosteer"].artifacts,
    )
    rows = {
        step: {name: refs[name].sha256 if name in refs else "—" for name in names}
        for step, refs in steps.items()
    }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("step")


def load_report(store: ArtifactStore, run_id: str, store_root: str) -> RunReport:
    """Everything the report needs of ``run_id``; ``store_root`` is the store as the reader
    names it (the replay command uses it)."""
    config_ref = RunIndex(store, run_id).lookup(0, CONFIG_ENTRY)
    return RunReport(
        run_id=run_id,
        store_root=store_root,
        config=run_config(store, run_id),
        history=run_history(store, run_id),
        hashes=artifact_hashes(store, run_id),
        recorded=run_provenance(store, run_id),
        config_yaml=store.get_bytes(config_ref).decode("utf-8"),
        config_sha256=config_ref.sha256,
    )


def _svg(figsize: tuple[float, float], draw: Callable[[Axes], None]) -> str:
    """An SVG document of one axes that ``draw`` fills (text kept as text, no timestamp).
    A bare ``Figure``, not pyplot: no backend is chosen and no global figure state is kept."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    rc = {"svg.fonttype": "none", "svg.hashsalt": "evosteer-report", "font.size": 10}
    with rc_context(rc):
        fig = Figure(figsize=figsize)
        ax = fig.subplots()
        draw(ax)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue().decode("utf-8")


def _figure(svg: str, alt: str, caption: str) -> str:
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return (
        f"<figure class='plot'><img alt='{html.escape(alt, quote=True)}' "
        f"src='data:image/svg+xml;base64,{data}'>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _plot(history: pd.DataFrame, title: str, columns: Sequence[str]) -> str:
    """Lines of ``columns`` over the (integer) steps, each series in its own style."""
    from matplotlib.ticker import MaxNLocator

    def draw(ax: Axes) -> None:
        present = [c for c in columns if c in history]
        for i, col in enumerate(present):
            style = SERIES_STYLES[i % len(SERIES_STYLES)]
            ax.plot(
                history.index,
                history[col],
                label=col,
                linewidth=1.8,
                alpha=0.9,
                markerfacecolor=style["color"] if i == 0 else "none",
                markeredgewidth=1.4,
                zorder=2 + i,
                **style,
            )
        if present:
            ax.legend(fontsize=9, frameon=False, loc="best")
        else:
            ax.text(
                0.5,
                0.5,
                "not recorded by this run",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="#5b6676",
            )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if len(history.index) == 1:  # one step: an axis around it, still in whole steps
            step = int(history.index[0])
            ax.set_xlim(step - 1, step + 1)
        ax.set_title(title, fontsize=11, loc="left")
        ax.set_xlabel("step")

    return _svg((6.4, 3.4), draw)


def figures_html(history: pd.DataFrame) -> str:
    """The :data:`PLOTS` of ``history`` as ``<figure>``s with an SVG data URI each: the report
    and the Flyte Decks both show exactly these."""
    figures = [
        _figure(_plot(history, title, cols), title, f"{', '.join(cols)} per step")
        for title, cols in PLOTS
    ]
    return f"<div class='figures'>{''.join(figures)}</div>"


def _table(frame: pd.DataFrame, table_id: str, css: str = "data") -> str:
    """A table in a horizontally scrolling box (wide tables scroll; the first column stays)."""
    body = frame.reset_index().to_html(
        classes=css, border=0, table_id=table_id, index=False, float_format=lambda x: f"{x:.4g}"
    )
    return f"<div class='table-scroll'>{body}</div>"


def _kv(items: Iterable[tuple[str, str]], dl_id: str = "") -> str:
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{v}</dd>" for k, v in items)
    ident = f" id='{dl_id}'" if dl_id else ""
    return f"<dl class='kv'{ident}>{rows}</dl>"


def _mono(text: str) -> str:
    return f"<code>{html.escape(text)}</code>"


def _code_items(code: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(label, _mono(code[key])) for key, label in CODE_FIELDS if key in code]


def _code_section(recorded: dict | None) -> str:
    here = code_summary()
    parts = ["<section class='card' id='code'><h2>Code version</h2>"]
    if recorded is not None:
        parts.append(_kv(_code_items(recorded["code"]), "code-recorded"))
        parts.append("<p class='note'>The code of the run's latest train execution.</p>")
        if recorded["code"].get(CODE_HASH_TAG) != here.get(CODE_HASH_TAG):
            parts.append("<details><summary>This report was written by other code</summary>")
            parts.append(_kv(_code_items(here)) + "</details>")
    else:
        parts.append(_kv(_code_items(here), "code-recorded"))
        parts.append(
            "<p class='note'>This run recorded no code version (it predates the record); "
            "shown is the code that wrote this report.</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _mlflow_section(cfg: RunConfig, recorded: dict | None) -> str:
    parts = ["<section class='card' id='mlflow'><h2>MLflow</h2>"]
    mlflow = recorded.get("mlflow") if recorded else None
    if mlflow:
        link = html.escape(mlflow["url"], quote=True)
        parts.append(
            _kv(
                [
                    (
                        "run",
                        f"<a id='mlflow-link' href='{link}'>{html.escape(mlflow['run_id'])}</a>",
                    ),
                    (
                        "experiment",
                        f"{html.escape(cfg.tracking.experiment)} "
                        f"(id {html.escape(mlflow['experiment_id'])})",
                    ),
                    ("tracking URI", _mono(mlflow["tracking_uri"])),
                ]
            )
        )
        if not mlflow["tracking_uri"].startswith(("http://", "https://")):
            ui = f"mlflow ui --backend-store-uri {shlex.quote(mlflow['tracking_uri'])}"
            parts.append("<p class='note'>The link opens once the local UI runs:</p>")
            parts.append(f"<pre class='cmd' id='mlflow-ui'>{html.escape(ui)}</pre>")
    elif recorded is not None or not cfg.tracking.enabled:
        parts.append(
            "<p id='mlflow-none'>Tracking was off for this run "
            "(<code>tracking.enabled: false</code>).</p>"
        )
    else:
        parts.append(
            "<p id='mlflow-none'>This run recorded no MLflow run id (it predates the "
            f"record); look for the tag <code>evosteer.run_id</code> in experiment "
            f"{html.escape(cfg.tracking.experiment)}.</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _hash_item(cfg: RunConfig, run_id: str) -> str:
    """The config hash, flagged when it does not end the run id: this code hashes the recorded
    config otherwise than the code that named the run did."""
    digest = config_hash(cfg)
    if run_id.endswith(f"-{digest[:12]}"):
        return _mono(digest)
    return f"{_mono(digest)} <span class='badge sim'>not the run id's: hashed by other code</span>"


def _commands_section(report: RunReport) -> str:
    root, run = shlex.quote(report.store_root), shlex.quote(report.run_id)
    last = int(report.history.index.max())
    replay = f"evosteer replay --run-dir {root} --run {run} --step {last}"
    evaluate = f"evosteer evaluate --run-dir {root} --run {run} --step {last}"
    return (
        "<section class='card wide' id='replay'><h2>Replay</h2>"
        "<p class='note'>Recomputes a step and compares every artifact (exit 0: identical); "
        f"any recorded step 1–{last} can be given.</p>"
        f"<pre class='cmd' id='replay-command'>{html.escape(replay)}</pre>"
        "<p class='note'>Evaluate the checkpoint of that step:</p>"
        f"<pre class='cmd' id='evaluate-command'>{html.escape(evaluate)}</pre></section>"
    )


def render_html(report: RunReport) -> str:
    """The self-contained report page of ``report``."""
    cfg, history = report.config, report.history
    simulated = cfg.executor.kind == "sim"
    run = html.escape(report.run_id)
    badge = (
        "<span class='badge sim' id='simulated'>SIMULATED executor</span>"
        if simulated
        else f"<span class='badge'>{html.escape(cfg.executor.kind)} executor</span>"
    )
    steps = history.index
    final_state = report.hashes.loc[int(steps.max()), "state"]
    summary = _kv(
        [
            ("run id", _mono(report.run_id)),
            ("steps", f"{len(steps)} completed ({int(steps.min())}–{int(steps.max())})"),
            ("config hash", _hash_item(cfg, report.run_id)),
            ("config object", _mono(report.config_sha256)),
            ("final state", _mono(final_state)),
            ("store", _mono(report.store_root)),
            ("objective", html.escape(cfg.train.objective)),
            ("backbone", _mono(cfg.policy.backbone)),
        ],
        "summary-list",
    )
    nav = "".join(
        f"<a href='#{k}'>{v}</a>"
        for k, v in (
            ("summary", "Summary"),
            ("code", "Code"),
            ("mlflow", "MLflow"),
            ("replay", "Replay"),
            ("plots", "Plots"),
            ("metrics", "Metrics"),
            ("hashes", "Artifact hashes"),
            ("config", "Config"),
        )
    )
    title = f"EvoSteer run {run}" + (" (SIMULATED executor)" if simulated else "")
    return "\n".join(
        [
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>{title}</title><style>{STYLE}</style></head><body><main>",
            f"<header class='top'><h1>EvoSteer run {run}</h1>{badge}</header>",
            f"<nav>{nav}</nav>",
            "<div class='cards'>",
            f"<section class='card wide' id='summary'><h2>Summary</h2>{summary}</section>",
            _code_section(report.recorded),
            _mlflow_section(cfg, report.recorded),
            _commands_section(report),
            "</div>",
            f"<section class='card' id='plots'><h2>Plots</h2>{figures_html(history)}</section>",
            "<section class='card' id='metrics'><h2>Metrics per step</h2>"
            f"{_table(history, 'metrics-table')}</section>",
            "<section class='card' id='hashes'><h2>Artifact hashes (sha256) per step</h2>"
            f"{_table(report.hashes, 'hashes-table', 'data hashes')}</section>",
            "<section class='card' id='config'><h2>Config</h2>"
            "<p class='note'>As recorded at step 0 (credentials redacted).</p>"
            f"<pre class='config' id='config-yaml'>{html.escape(report.config_yaml)}</pre></section>",
            "</main></body></html>",
        ]
    )


def deck_html(history: pd.DataFrame, run_id: str) -> str:
    """A Flyte Deck of a run's progress: the report's plots and metrics table."""
    return (
        f"<style>{STYLE}</style><main><h2>EvoSteer run {html.escape(run_id)}: "
        f"{len(history)} steps</h2>{figures_html(history)}"
        f"<h2>Metrics per step</h2>{_table(history, 'metrics-table')}</main>"
    )


def evaluation_deck_html(table: EvalTable, checkpoint: str) -> str:
    """A Flyte Deck of an evaluation: mean ± std per benchmark and group, as a bar plot and
    the table."""
    scores = [*table.benchmarks, *table.groups]
    frame = pd.DataFrame(
        {
            "mean": [s.mean for s in scores],
            "std": [s.std for s in scores],
            "n": [s.n for s in scores],
        },
        index=pd.Index([s.name for s in scores], name="benchmark"),
    )

    def draw(ax: Axes) -> None:
        color = SERIES_STYLES[0]["color"]
        ax.barh(frame.index, frame["mean"], xerr=frame["std"], color=color, alpha=0.85, capsize=3)
        ax.invert_yaxis()
        ax.set_xlabel("mean reward")

    bars = _svg((6.4, 0.45 * len(frame) + 1.2), draw)
    return (
        f"<style>{STYLE}</style><main><h2>Evaluation of checkpoint "
        f"{html.escape(checkpoint[:12])}</h2><div class='figures'>"
        f"{_figure(bars, 'Evaluation: mean ± std', 'mean reward ± sample std over runs')}</div>"
        f"{_table(frame, 'evaluation-table')}</main>"
    )
