"""The HTML report (issue 16 item 10; evosteer_core/pipeline/report.py) and its Flyte Decks.

The plots' step axes carry whole steps and each series of a plot has its own style; the page is
checked in a real headless Chromium (served from a 127.0.0.1 server the test starts): no
console error, no request leaves the machine, the key elements are there, the plots decode,
wide tables scroll inside their box while the page does not, and a screenshot is taken. The
Decks of ``record_step`` and ``summarize_evaluation`` are written under local execution and
hold the report's own figures.

Chromium is a system package (``.ci/run`` installs it); without it the browser test skips
outside CI and fails in CI (``CI`` set).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import http.server
import os
import re
import shutil
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from pipeline_support import recorded_run

from evosteer_core.evaluation.tables import summarize
from evosteer_core.infra.artifacts import LocalStore, RunIndex, open_store
from evosteer_core.infra.provenance import CODE_HASH_TAG, code_summary
from evosteer_core.infra.runs import PROVENANCE_ENTRY, config_hash, run_provenance
from evosteer_core.infra.tracking import ui_url
from evosteer_core.pipeline.report import (
    PLOTS,
    _code_section,
    _mlflow_section,
    figures_html,
    load_report,
    render_html,
    run_history,
)
from evosteer_flyte.cli import main as cli_main

STEPS = 12
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SVG_URI = re.compile(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)")
NS = {"svg": "http://www.w3.org/2000/svg"}


def overlapping_metrics(step: int) -> Mapping[str, Mapping[str, float]]:
    """Series that coincide (ρ equals θ; the loss sits on its anchor-only level at step 1;
    validated and retired counts both 0) and enough metrics for a wide table."""
    reward = 0.1 + 0.02 * step
    return {
        "value": {
            "reward_theta": reward,
            "reward_rho": reward,
            **{f"value_metric_{i:02d}": i / step for i in range(16)},
        },
        "update": {"loss": 1.5 + 0.1 * (step - 1), "anchor_only_loss": 1.5},
        "skills": {
            "skills_candidate": float(step // 3),
            "skills_validated": 0.0,
            "skills_retired": 0.0,
            "alpha_spent": 0.01 * step,
        },
    }


def _mlflow(run: str = "0123456789abcdef0123456789abcdef") -> dict[str, str]:
    uri = "sqlite:////somewhere/mlflow.db"
    return {"tracking_uri": uri, "experiment_id": "7", "run_id": run, "url": ui_url(uri, "7", run)}


@pytest.fixture
def run_dir(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "run"
    _, run_id = recorded_run(root, STEPS, overlapping_metrics, _mlflow())
    return root, run_id


def _svgs(page: str) -> list[ET.Element]:
    return [ET.fromstring(base64.b64decode(m)) for m in SVG_URI.findall(page)]


def _x_tick_labels(svg: ET.Element) -> list[str]:
    ticks = [
        g for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("id", "").startswith("xtick_")
    ]
    return ["".join(t.itertext()).strip() for g in ticks for t in g.iterfind(".//svg:text", NS)]


@pytest.mark.parametrize("steps", [1, 3, STEPS])
def test_step_axes_are_whole_steps(tmp_path: Path, steps: int) -> None:
    """Before: matplotlib's default ticks put 1.25, 1.5, … on a 3-step run's step axis."""
    root = tmp_path / "run"
    _, run_id = recorded_run(root, steps, overlapping_metrics)
    svgs = _svgs(figures_html(run_history(LocalStore(root), run_id)))
    assert len(svgs) == len(PLOTS)
    for svg in svgs:
        labels = _x_tick_labels(svg)
        assert labels, "no x tick labels found"
        ticks = [int(label.replace("\u2212", "-")) for label in labels]  # int() of "1.25" raises
        assert len(set(ticks)) >= 2 and all(0 <= t <= steps + 1 for t in ticks), ticks


def _series(svg: ET.Element) -> list[tuple[str, str, str]]:
    """(colour, dash pattern, marker shape) of each data series: matplotlib's ``line2d_*``
    groups whose line is clipped to the axes and that carry markers (grid lines are clipped
    but bare, tick marks and legend samples are not clipped)."""
    out = []
    for g in svg.iter("{http://www.w3.org/2000/svg}g"):
        if not g.get("id", "").startswith("line2d_"):
            continue
        line = next((p for p in g.iterfind("svg:path", NS) if p.get("clip-path")), None)
        marker = g.find("svg:defs/svg:path", NS)
        if line is None or marker is None or g.find(".//svg:use", NS) is None:
            continue
        style = line.get("style", "")
        colour = re.search(r"stroke: (#[0-9a-f]{6})", style).group(1)
        dash = re.search(r"stroke-dasharray: ([^;]+)", style)
        out.append((colour, dash.group(1) if dash else "solid", marker.get("d")))
    return out


def test_coinciding_series_are_drawn_in_distinct_styles(run_dir: tuple[Path, str]) -> None:
    root, run_id = run_dir
    history = run_history(LocalStore(root), run_id)
    assert (history["reward_theta"] == history["reward_rho"]).all()  # the fixture overlaps
    for svg, (title, cols) in zip(_svgs(figures_html(history)), PLOTS, strict=True):
        series = _series(svg)
        assert len(series) == len(cols), (title, series)
        for part in range(3):  # colour, line pattern and marker each tell the series apart
            assert len({s[part] for s in series}) == len(cols), (title, series)
        text = "".join(svg.itertext())
        assert all(col in text for col in cols), (title, "legend")


def test_provenance_is_recorded_and_shown(run_dir: tuple[Path, str]) -> None:
    root, run_id = run_dir
    store = LocalStore(root)
    recorded = run_provenance(store, run_id)
    assert recorded == {"code": code_summary(), "mlflow": _mlflow()}
    report = load_report(store, run_id, str(root))
    page = render_html(report)
    assert config_hash(report.config) in page and code_summary()[CODE_HASH_TAG] in page
    assert "<a id='mlflow-link' href='http://127.0.0.1:5000/#/experiments/7/runs/" in page
    assert "this report was written by other code" not in page.lower()

    assert "recorded no code version" in _code_section(None)  # a run from before the entry
    assert "recorded no MLflow run id" in _mlflow_section(report.config, None)
    other = {**recorded, "code": {**recorded["code"], CODE_HASH_TAG: "f" * 64}}
    assert "written by other code" in _code_section(other)
    assert "Tracking was off" in _mlflow_section(report.config, {**recorded, "mlflow": None})
    assert RunIndex(store, run_id).lookup(0, PROVENANCE_ENTRY)
    assert "hashed by other code" not in page
    renamed = dataclasses.replace(report, run_id="tiny-sim-000000000000")
    assert "hashed by other code" in render_html(renamed)


def test_ui_url_is_the_server_or_the_local_ui() -> None:
    assert (
        ui_url("https://mlflow.example/", "3", "ab")
        == "https://mlflow.example/#/experiments/3/runs/ab"
    )
    assert (
        ui_url("sqlite:////x/mlflow.db", "3", "ab")
        == "http://127.0.0.1:5000/#/experiments/3/runs/ab"
    )


# --------------------------------------------------------------------------- Flyte Decks


def _decks_since(started: float) -> list[Path]:
    """deck.html files flytekit wrote (local execution: under its sandbox) since ``started``."""
    from flytekit import FlyteContextManager

    sandbox = Path(FlyteContextManager.current_context().file_access.local_sandbox_dir)
    found = [p for p in sandbox.rglob("deck.html") if p.stat().st_mtime >= started]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def test_record_step_writes_the_report_figures_as_a_deck(tmp_path: Path) -> None:
    """At the run's last step (and every DECK_EVERY steps) the deck holds the report's own
    figures; between them it has none."""
    from evosteer_flyte.tasks.spec import make_spec
    from evosteer_flyte.tasks.tracking_tasks import DECK_EVERY, record_step

    cfg, run_id = recorded_run(
        tmp_path / "run", STEPS, overlapping_metrics, None, **{"train.steps": STEPS}
    )
    store = open_store(cfg.store.root)
    index = RunIndex(store, run_id)
    spec = make_spec(cfg)
    decks = {}
    for step in (STEPS, DECK_EVERY + 1):
        started = time.time() - 1
        refs = index.step_artifacts(step)
        out = record_step(spec=spec, config_yaml=cfg.to_yaml(), mlflow_run="", step=step, refs=refs)
        assert out == refs["state"]
        written = _decks_since(started)
        assert written, f"record_step wrote no deck at step {step}"
        decks[step] = written[-1].read_text(encoding="utf-8")
    deck = decks[STEPS]
    assert figures_html(run_history(store, run_id)) in deck  # the report's figures, as drawn
    assert "Training" in deck and "metrics-table" in deck
    assert "rollouts_theta" not in deck  # no input deck: the config text is not shown
    assert "data:image/svg+xml" not in decks[DECK_EVERY + 1]


def test_summarize_evaluation_writes_its_table_as_a_deck(tmp_path: Path) -> None:
    from evosteer_flyte.tasks.evaluate import summarize_evaluation
    from evosteer_flyte.tasks.spec import make_spec

    cfg, _ = recorded_run(
        tmp_path / "run", 1, overlapping_metrics, None, **{"tracking.enabled": False}
    )
    state = open_store(cfg.store.root).put_bytes(b"a checkpoint", "state")
    scores = {"hotpotqa": [0.5, 0.75], "gpqa": [0.25, 0.5]}
    started = time.time() - 1
    summarize_evaluation(
        spec=make_spec(cfg),
        config_yaml=cfg.to_yaml(),
        mlflow_run="",
        state=state,
        benchmarks=list(scores),
        scores=list(scores.values()),
    )
    deck = _decks_since(started)[-1].read_text(encoding="utf-8")
    table = summarize(scores)
    assert f"Evaluation of checkpoint {state.sha256[:12]}" in deck
    assert "evaluation-table" in deck and len(SVG_URI.findall(deck)) == 1
    for score in (*table.benchmarks, *table.groups):
        assert f"<td>{score.name}</td>" in deck and f"{score.mean:.4g}" in deck


# --------------------------------------------------------------------------- the browser


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    return found or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Chromium driven by playwright; in CI (``CI`` set) its absence is a failure."""
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if executable is None or sync_playwright is None:
        missing = "chromium (apt-get install chromium)" if executable is None else "playwright"
        if os.environ.get("CI"):
            pytest.fail(f"{missing} is missing; .ci/run installs it")
        pytest.skip(f"{missing} is not installed")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A 127.0.0.1 HTTP server over a fresh folder: (base URL, folder)."""
    folder = tmp_path / "site"
    folder.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", folder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_the_report_in_a_headless_browser(browser, served, run_dir, capsys) -> None:
    base, folder = served
    root, run_id = run_dir
    out = folder / "report.html"
    assert cli_main(["report", "--run-dir", str(root), "--run", run_id, "--out", str(out)]) == 0
    assert f"wrote {out} ({STEPS} steps)" in capsys.readouterr().out

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def only_here(route) -> None:
        if route.request.url.startswith(base):
            route.continue_()
        else:  # the report must render offline: nothing is fetched from elsewhere
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_here)
    try:
        assert page.goto(f"{base}/report.html", wait_until="load").ok
        shot = page.screenshot(path=str(folder / "report.png"), full_page=True)
        text = {sel: page.inner_text(sel) for sel in ("#summary", "#code", "#mlflow", "#replay")}
        images = page.eval_on_selector_all(
            "#plots img", "els => els.map(e => [e.complete, e.naturalWidth, e.alt])"
        )
        href = page.get_attribute("#mlflow-link", "href")
        scroll = page.evaluate(
            """() => ['metrics-table', 'hashes-table'].map(id => {
                 const box = document.getElementById(id).parentElement;
                 return [getComputedStyle(box).overflowX, box.scrollWidth, box.clientWidth];
               }).concat([[document.documentElement.scrollWidth, window.innerWidth]])"""
        )
        replay = page.inner_text("#replay-command")
        config_text = page.inner_text("#config-yaml")
        rows = page.eval_on_selector_all("#hashes-table tbody tr", "rs => rs.length")
    finally:
        page.close()

    assert errors == [] and outside == []
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 50_000
    report = load_report(open_store(str(root)), run_id, str(root))
    assert config_hash(report.config) in text["#summary"]
    assert report.hashes.loc[STEPS, "state"] in text["#summary"]
    assert code_summary()[CODE_HASH_TAG] in text["#code"] and "cache version" in text["#code"]
    assert href == _mlflow()["url"] and "mlflow ui --backend-store-uri" in text["#mlflow"]
    assert replay == f"evosteer replay --run-dir {root} --run {run_id} --step {STEPS}"
    assert [alt for _, _, alt in images] == [title for title, _ in PLOTS]
    assert all(complete and width > 300 for complete, width, _ in images), images
    assert "name: tiny-sim" in config_text and rows == STEPS + 1
    *tables, (page_width, viewport) = scroll
    for overflow, wide, visible in tables:  # both tables are wider than the page: they scroll
        assert overflow == "auto" and wide > visible, scroll
    assert page_width <= viewport, "the page itself scrolls sideways"
