"""scripts/bench_run.py on a two-step run of the smallest tiny-sim settings and its cached
re-run (issue 15): every stage of every step is timed, the overhead share is a share, the
re-run computes nothing and is faster; run again on the finished run dir, it says that the run
computed nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_support import SMALL

from evosteer_core.pipeline.stage_io import METHODS

pytestmark = pytest.mark.slow  # two whole training runs through the CLI (~90 s on 2 cores)

REPO = Path(__file__).resolve().parents[1]
SETS = [arg for k, v in SMALL.items() for arg in ("--set", f"{k}={v}")]


def bench(home: Path, run_dir: Path, *extra: str) -> str:
    """The script's stdout, run with this checkout and a home of its own (a flytekit cache
    that holds nothing of the user's)."""
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("EVOSTEER_CACHE", None)
    argv = [sys.executable, str(REPO / "scripts" / "bench_run.py"), "--steps", "2", *SETS]
    done = subprocess.run(
        [*argv, "--run-dir", str(run_dir), *extra],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    return tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("run")


@pytest.fixture(scope="module")
def figures(dirs) -> dict:
    return json.loads(bench(*dirs, "--rerun", "--json"))


def test_the_first_run_computes_and_times_every_stage_of_every_step(figures):
    first = figures["first"]
    assert first["steps_recorded"] == 2
    assert first["computed_every_stage"] and first["missing"] == []
    assert list(first["stage_s"]) == [s.name for s in METHODS["evosteer"].stages]
    assert all(s > 0 for s in first["stage_s"].values()), first["stage_s"]
    assert first["stages_total_s"] == pytest.approx(sum(first["stage_s"].values()))
    assert first["s_per_step_stages"] == pytest.approx(first["stages_total_s"] / 2)
    assert first["s_per_step_wall"] == pytest.approx(first["wall_s"] / 2)


def test_the_wall_splits_into_start_up_stages_and_tail(figures):
    first = figures["first"]
    assert 0 <= first["overhead_share_excl_startup"] < first["overhead_share"] < 1
    assert first["process_start_s"] > 0 and first["run_setup_s"] > 0
    assert first["startup_s"] == pytest.approx(first["process_start_s"] + first["run_setup_s"])
    # stages run one after another: the span holds their seconds (log times are to the ms)
    assert first["between_stages_s"] > -0.01
    assert first["tail_s"] > 0
    assert first["cli_train_s"] < first["wall_s"]


def test_the_cached_rerun_computes_nothing_and_is_faster(figures):
    rerun = figures["rerun"]
    assert rerun["new_records"] == 0
    assert rerun["wall_s"] < figures["first"]["wall_s"]
    assert rerun["ratio"] == pytest.approx(rerun["wall_s"] / figures["first"]["wall_s"])
    assert rerun["cli_train_s"] < figures["first"]["cli_train_s"]


def test_a_run_dir_holding_the_run_is_reported_as_not_computed(dirs, figures):
    out = bench(*dirs)
    assert f"run {figures['first']['run_id']}: 0 of 2 steps computed\n" in out
    assert "NOT COMPUTED by this run (cached or recorded before): 1:rollout, 1:rescore" in out
    assert "overhead share" not in out
