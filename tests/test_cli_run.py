"""One step of ``evosteer train`` in a fresh process, read as a user and as the docs: the
terminal shows one progress bar naming the stage, no library noise (issue 16 item 9), the rest
is in the run's log file; and every metric and file name that docs/pipeline.md and the README
list is what the run logged to MLflow (item 7)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from mlflow import MlflowClient
from pipeline_support import SMALL, small_config

from evosteer_core.infra.runs import run_id_for
from evosteer_core.infra.tracking import resolve_tracking
from evosteer_core.pipeline.stage_io import STAGES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """``evosteer train --steps 1`` on the smallest config, with a home of its own (so flytekit's
    cache and the tiny backbone are new: nothing is cached, every stage runs and loads)."""
    home = tmp_path_factory.mktemp("home")
    root = tmp_path_factory.mktemp("run")
    sets = [arg for k, v in SMALL.items() for arg in ("--set", f"{k}={v}")]
    env = {**os.environ, "HOME": str(home)}
    env.pop("EVOSTEER_CACHE", None)
    argv = ["train", "--steps", "1", "--run-dir", str(root), *sets]
    proc = subprocess.run(
        [sys.executable, "-m", "evosteer_flyte.cli", *argv],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg = small_config(root)
    assert proc.stdout.strip().splitlines()[-1] == run_id_for(cfg)
    return cfg, proc


def _frames(err: str) -> list[str]:
    """What the terminal showed: tqdm redraws a line after ``\\r``, so split on both."""
    return [f.strip() for f in err.replace("\r", "\n").splitlines() if f.strip()]


def test_terminal_shows_one_progress_bar_naming_the_stage(cli_run):
    _, proc = cli_run
    err = proc.stderr
    for noise in ("Loading weights", "Writing model shards", "Warning", "warnings.warn"):
        assert noise not in err, noise
    stray = [f for f in _frames(err) if not f.startswith("train: ")]
    assert not stray, stray[:5]  # nothing but the bar's frames
    for stage in STAGES:
        assert f"step 1 {stage.name}" in err, stage.name
    assert "1/1 [" in err and "s/step" in err
    assert re.search(r"step 1: θ \d\.\d{3} ρ \d\.\d{3}", err)


def test_a_sim_run_ends_with_theta_against_rho_and_the_best_paradigm(cli_run):
    _, proc = cli_run
    out = proc.stdout
    assert re.search(r"Held-out \(12 tasks × 1 run, SIMULATED\):", out)
    assert re.search(r"π_θ \d\.\d{3}   ρ \d\.\d{3}   θ − ρ [+-]\d\.\d{3} ± \d\.\d{3}", out)
    assert re.search(r"best fixed paradigm (react|template|plan_execute) \d\.\d{3}", out)


def test_the_rest_goes_to_the_run_log_file(cli_run):
    cfg, proc = cli_run
    path = Path(cfg.store.root) / "logs" / f"{run_id_for(cfg)}.log"
    assert f"Log file:       {path}" in proc.stdout.splitlines()
    log = path.read_text(encoding="utf-8")
    assert "INFO evosteer_flyte.console: evosteer train --steps 1 --run-dir " in log
    for stage in STAGES:
        assert f"INFO evosteer_core.pipeline.stage_io: step 1: {stage.name}\n" in log


def test_quiet_transformers_hides_bars_and_logs_each_warning_once(capfd, caplog):
    from transformers.utils import logging as hf_logging

    from evosteer_core.infra.quiet import quiet_transformers

    assert hf_logging.is_progress_bar_enabled()
    quiet = quiet_transformers("loading a test model")
    with caplog.at_level(logging.INFO, "evosteer_core.infra.quiet"), quiet:
        for _ in hf_logging.tqdm(range(3), desc="Loading weights"):
            warnings.warn("old attribute", FutureWarning, stacklevel=1)
    assert hf_logging.is_progress_bar_enabled()  # restored
    out, err = capfd.readouterr()
    assert "Loading weights" not in err and "old attribute" not in err
    assert [r.getMessage() for r in caplog.records] == [
        "while loading a test model: FutureWarning: old attribute"
    ]
    with pytest.raises(RuntimeError), quiet_transformers("failing"):
        raise RuntimeError("boom")
    assert hf_logging.is_progress_bar_enabled()


# --- the docs name what the run logs -------------------------------------------------------
def _logged(cfg, proc) -> tuple[set[str], set[str]]:
    """(metric names, artifact paths) of the run's MLflow run."""
    client = MlflowClient(tracking_uri=resolve_tracking(cfg.tracking, cfg.store)[0])
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("MLflow run:")]
    run_id = line.split()[2]

    def files(path: str | None) -> set[str]:
        out: set[str] = set()
        for item in client.list_artifacts(run_id, path):
            out |= files(item.path) if item.is_dir else {item.path}
        return out

    return set(client.get_run(run_id).data.metrics), files(None)


def _doc_metrics(text: str) -> set[str]:
    """The names in the first column of docs/pipeline.md's table of step metrics."""
    rows = text.split("| metric | from | what it is |", 1)[1].splitlines()[2:]
    names: set[str] = set()
    for row in rows:
        if not row.startswith("|"):
            break
        names |= set(re.findall(r"`([^`]+)`", row.split("|")[1]))
    return names


def _doc_files(text: str) -> set[str]:
    """The files of docs/pipeline.md's "Run layout in MLflow" block, step 1's as logged
    (``step_0001/`` plus each name on its line and the indented lines under it)."""
    block = text.split("Run layout in MLflow:", 1)[1].split("```")[1]
    files: set[str] = set()
    prefix = ""
    for line in block.splitlines():
        if not line.strip() or line.strip().endswith("/..."):
            continue
        if line.startswith("step_"):
            prefix, _, line = line.partition("/")
            prefix += "/"
        elif not line[0].isspace():
            prefix = ""
        files |= {prefix + name for name in line.split()}
    return files


def test_docs_list_exactly_the_metrics_and_files_a_run_logs(cli_run):
    metrics, files = _logged(*cli_run)
    text = (REPO / "docs" / "pipeline.md").read_text(encoding="utf-8")
    assert _doc_metrics(text) == metrics
    assert _doc_files(text) == files


def test_readme_names_only_what_a_run_logs(cli_run):
    """The README's MLflow paragraph: its metric names, and its per-step files."""
    metrics, files = _logged(*cli_run)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    paragraph = readme.split("* **MLflow.** Per step:", 1)[1].split("\n* ", 1)[0]
    named, _, rest = paragraph.partition("artifacts `step_000k/{")
    names = set(re.findall(r"`([^`]+)`", named))
    assert len(names) >= 8 and names <= metrics, names - metrics
    listed = re.sub(r"\([^)]*\)", "", rest.split("}`", 1)[0])
    for name in (n.strip() for n in listed.split(",")):
        path = f"step_0001/{name}"
        assert path in files or any(f.startswith(path) for f in files if name.endswith("/")), name
