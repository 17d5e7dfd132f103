"""Time a whole ``evosteer train`` run end to end, as a user launches it, and split its wall
clock into the stages' own seconds and the rest: the Flyte/task overhead (issue 15).

Usage: python scripts/bench_run.py [--config configs/tiny-sim.yaml] [--steps 10] [--run-dir DIR]
                                   [--set KEY=VALUE ...] [--rerun] [--json]

Runs ``evosteer train --config CONFIG --steps N --run-dir DIR --no-summary [--set ...]`` in a
fresh process (the ``evosteer`` console script beside this interpreter, else ``python -m
evosteer_flyte.cli``; this checkout first on PYTHONPATH) in a fresh temporary run dir (removed
afterwards) unless ``--run-dir`` is given, and times it. Then it reads the usage records the
run's stages wrote (``pipeline/usage.py``; only those this run wrote count) and prints:

* ``wall``: the process, from start to exit. It is split into the *start-up* (process start
  to the first stage's start), the *stage span* (first stage start to the last stage's end:
  the stages and what runs between them: each step's record task, flytekit's plumbing) and the
  *tail* (the last step's record task with the Decks' plots, the MLflow run's end and model
  registration, the summary lines, interpreter exit). The start-up is split again at the
  command's first log line: *process and imports* (interpreter, torch, flytekit, MLflow, the
  config's load) and *run set-up* (run lock, the workflow, the step-0 state, the MLflow run's
  start). Times come from the run's log file (millisecond timestamps; ``step K: <stage>`` is
  logged as a stage starts) and the stages' recorded seconds. ``cli_train_s`` is the CLI's own
  figure ("Trained N steps … in X s": run lock to the workflow's return).
* Σ of each stage's seconds (a stage's wall inside its task: loading its inputs, opening the
  session with its model, running, storing its outputs) and of all stages; s/step as wall / N
  and as Σ stages / N (N: the steps this run computed).
* the overhead share: 1 − Σ stages / wall, the time outside the stage bodies (flytekit's
  local task plumbing, cache look-ups, input/output serialization, each step's record task
  with its MLflow logging, and the start-up); and the same excluding the start-up, 1 − Σ
  stages / (wall − start-up): what a longer run keeps paying per step, plus the one-off tail.
* whether the run really computed every stage of every step 1..N (a run dir that held the run
  already, or a cache hit, computes nothing: the figures would then time cache look-ups, and
  the output says so), the child's peak RSS and CPU seconds.

``--rerun`` runs the same command a second time on the same run dir: the run is finished, so
every task is a flytekit cache hit (``~/.flyte/local-cache``, never cleared here) and nothing
is computed. It prints that run's wall, its ratio to the first (the issue's aim: ≤ 1 %) and
how many usage records it wrote (none: a cached stage writes none). A re-run's wall is mostly
the process start-up, so the ratio shrinks as the first run grows.

``--json`` prints one JSON object of every figure instead of the table. See also
scripts/bench_step.py (one step in-process, stage by stage).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from evosteer_core.infra.artifacts import LocalStore
from evosteer_core.infra.locks import run_log_path
from evosteer_core.infra.runs import run_config
from evosteer_core.pipeline.stage_io import METHODS
from evosteer_core.pipeline.usage import PREFIX, StageUsage, UsageLog

ROOT = Path(__file__).resolve().parent.parent

LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO (\S+): (.*)$", re.MULTILINE)
"""A line of the run's log file (``console.LOG_FORMAT``): time, logger, message."""
STAGE_START = re.compile(r"step (\d+): (\w+)")
"""The message ``stage_io.run_stage`` logs as a stage starts."""
TRAINED_LINE = re.compile(r"^Trained \d+ steps of .* in ([\d.]+) s\.$", re.MULTILINE)

Records = dict[tuple[int, str, int], StageUsage]
"""Usage records by (step, stage, shard)."""


def evosteer_command() -> list[str]:
    """The ``evosteer`` console script of this interpreter's environment, else the module."""
    script = Path(sys.executable).with_name("evosteer")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "evosteer_flyte.cli"]


def usage_records(run_dir: Path, run_id: str) -> Records:
    return {
        (step, r.stage, r.shard): r
        for step, records in UsageLog(LocalStore(run_dir), run_id).steps().items()
        for r in records
    }


def all_usage(run_dir: Path) -> dict[str, Records]:
    """Every run's usage records in ``run_dir`` (what was there before a run)."""
    base = run_dir / PREFIX
    runs = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    return {run_id: usage_records(run_dir, run_id) for run_id in runs}


def log_sizes(run_dir: Path) -> dict[str, int]:
    """The size of every run log in ``run_dir`` (logs are appended: a run's lines follow)."""
    logs = run_dir / "logs"
    return {p.name: p.stat().st_size for p in logs.glob("*.log")} if logs.is_dir() else {}


@dataclass(frozen=True)
class Run:
    """One ``evosteer train`` process: its wall and CPU seconds, its peak RSS (KiB; the max over
    this script's children so far), its output and what was in the run dir before it."""

    started: float
    wall_s: float
    cpu_s: float
    max_rss_kib: int
    stdout: str
    usage_before: dict[str, Records]
    logs_before: dict[str, int]

    @property
    def run_id(self) -> str:
        return self.stdout.strip().splitlines()[-1]

    def new_records(self, run_dir: Path) -> Records:
        """The usage records this run wrote (new or replaced: a recomputed stage's seconds)."""
        before = self.usage_before.get(self.run_id, {})
        after = usage_records(run_dir, self.run_id)
        return {key: r for key, r in after.items() if before.get(key) != r}

    def log_lines(self, run_dir: Path) -> list[tuple[float, str, str]]:
        """(epoch seconds, logger, message) of each INFO line this run wrote to its log."""
        path = run_log_path(str(run_dir), self.run_id)
        with path.open("rb") as fh:
            fh.seek(self.logs_before.get(path.name, 0))
            text = fh.read().decode("utf-8", errors="replace")
        return [
            (datetime.strptime(ts, "%Y-%m-%d %H:%M:%S,%f").timestamp(), logger, message)
            for ts, logger, message in LOG_LINE.findall(text)
        ]

    def stage_starts(self, run_dir: Path) -> list[tuple[float, int, str]]:
        """(epoch seconds, step, stage) of each stage this run started."""
        return [
            (t, int(m.group(1)), m.group(2))
            for t, logger, message in self.log_lines(run_dir)
            if logger == "evosteer_core.pipeline.stage_io" and (m := STAGE_START.fullmatch(message))
        ]

    def cli_started(self, run_dir: Path) -> float | None:
        """When the command's code began (its first log line: after the imports and the
        config's load, before the run lock)."""
        return next(
            (t for t, logger, _ in self.log_lines(run_dir) if logger == "evosteer_flyte.console"),
            None,
        )

    def cli_train_s(self) -> float | None:
        found = TRAINED_LINE.search(self.stdout)
        return float(found.group(1)) if found else None


def run_train(argv: list[str], run_dir: Path) -> Run:
    """Run ``evosteer train`` with ``argv``; its figures. A failed run exits this script."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}  # the child runs this checkout's code
    usage_before, logs_before = all_usage(run_dir), log_sizes(run_dir)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started, t0 = time.time(), time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        sys.exit(f"bench_run: {' '.join(argv)} exited {done.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Run(started, wall, cpu, after.ru_maxrss, done.stdout, usage_before, logs_before)


def first_figures(run: Run, run_dir: Path, steps: int) -> dict[str, Any]:
    """The figures of the first run (module docstring)."""
    records = run.new_records(run_dir)
    stages = [s.name for s in METHODS[run_config(LocalStore(run_dir), run.run_id).method].stages]
    computed = {(step, stage) for step, stage, _ in records}
    missing = [f"{k}:{s}" for k in range(1, steps + 1) for s in stages if (k, s) not in computed]
    per_stage = {
        s: sum(r.seconds for (_, name, _), r in records.items() if name == s) for s in stages
    }
    total = sum(r.seconds for r in records.values())
    n = len({step for step, _ in computed})
    figures: dict[str, Any] = {
        "run_id": run.run_id,
        "wall_s": run.wall_s,
        "cli_train_s": run.cli_train_s(),
        "steps_recorded": n,
        "computed_every_stage": not missing,
        "missing": missing,
        "stage_s": per_stage,
        "stages_total_s": total,
        "s_per_step_wall": run.wall_s / n if n else None,
        "s_per_step_stages": total / n if n else None,
        "overhead_share": 1 - total / run.wall_s,
        "peak_rss_mib": run.max_rss_kib / 1024,
        "cpu_s": run.cpu_s,
    }
    starts = run.stage_starts(run_dir)
    if starts and records:
        first = min(t for t, _, _ in starts)
        last_t, last_step, last_stage = max(starts)
        last_end = last_t + sum(
            r.seconds for (k, s, _), r in records.items() if (k, s) == (last_step, last_stage)
        )
        startup = first - run.started
        cli_started = run.cli_started(run_dir) or run.started
        figures |= {
            "startup_s": startup,
            "process_start_s": cli_started - run.started,
            "run_setup_s": first - cli_started,
            "stage_span_s": last_end - first,
            "between_stages_s": last_end - first - total,
            "tail_s": run.started + run.wall_s - last_end,
            "overhead_share_excl_startup": 1 - total / (run.wall_s - startup),
        }
    return figures


def rerun_figures(rerun: Run, first: Run, run_dir: Path) -> dict[str, Any]:
    cli_s, first_cli_s = rerun.cli_train_s(), first.cli_train_s()
    return {
        "wall_s": rerun.wall_s,
        "ratio": rerun.wall_s / first.wall_s,
        "cli_train_s": cli_s,
        "cli_train_ratio": cli_s / first_cli_s if cli_s is not None and first_cli_s else None,
        "new_records": len(rerun.new_records(run_dir)),
        "cpu_s": rerun.cpu_s,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def print_first(f: dict[str, Any], steps: int) -> None:
    """The first run's figures as a table (nothing per step when it computed nothing)."""
    print(f"run {f['run_id']}: {f['steps_recorded']} of {steps} steps computed", end="")
    print(", every stage" if f["computed_every_stage"] else "")
    if not f["computed_every_stage"]:
        shown = ", ".join(f["missing"][:8]) + (" …" if len(f["missing"]) > 8 else "")
        print(f"  NOT COMPUTED by this run (cached or recorded before): {shown}")
    print(
        f"  wall {f['wall_s']:.1f} s; peak RSS {f['peak_rss_mib']:.0f} MiB, CPU {f['cpu_s']:.1f} s"
    )
    if f["cli_train_s"] is not None:
        print(f"  the CLI's own 'Trained … in' {f['cli_train_s']:.1f} s")
    n, wall, total = f["steps_recorded"], f["wall_s"], f["stages_total_s"]
    if "startup_s" not in f:  # no stage ran (or its log is gone): nothing to split
        return
    print(
        f"  wall = start-up {f['startup_s']:.1f} s (process and imports"
        f" {f['process_start_s']:.1f} s, run set-up {f['run_setup_s']:.1f} s)"
        f" + stage span {f['stage_span_s']:.1f} s (of it between stages"
        f" {f['between_stages_s']:.1f} s) + tail {f['tail_s']:.1f} s"
    )
    print(f"  {'stage':<12} {'Σ s':>9} {'s/step':>8} {'of wall':>8}")
    for stage, sec in [*f["stage_s"].items(), ("all stages", total)]:
        print(f"  {stage:<12} {sec:9.1f} {sec / n:8.2f} {_pct(sec / wall):>8}")
    print(f"  s/step: {f['s_per_step_wall']:.2f} wall, {f['s_per_step_stages']:.2f} in stages")
    print(
        f"  overhead share: {_pct(f['overhead_share'])} of the wall,"
        f" {_pct(f['overhead_share_excl_startup'])} excluding start-up"
    )


def print_table(out: dict[str, Any]) -> None:
    print(" ".join(out["command"]))
    print_first(out["first"], out["steps"])
    if (r := out.get("rerun")) is not None:
        print(f"rerun (cached): wall {r['wall_s']:.1f} s = {_pct(r['ratio'])} of the first", end="")
        if r["cli_train_s"] is not None:
            print(
                f"; 'Trained … in' {r['cli_train_s']:.2f} s = {_pct(r['cli_train_ratio'])}", end=""
            )
        print(f"; {r['new_records']} new usage records")


@contextmanager
def run_dir_of(given: str | None) -> Iterator[Path]:
    """``--run-dir`` as given, or a fresh temporary one removed afterwards."""
    if given is not None:
        yield Path(given).resolve()
        return
    with tempfile.TemporaryDirectory(prefix="bench_run-") as tmp:
        yield Path(tmp)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "tiny-sim.yaml"))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--run-dir", default=None, help="default: a fresh temporary folder")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--rerun", action="store_true", help="run it again on the same run dir")
    p.add_argument("--json", action="store_true", help="one JSON object of every figure")
    args = p.parse_args()
    with run_dir_of(args.run_dir) as run_dir:
        argv = [*evosteer_command(), "train", "--config", args.config, "--steps", str(args.steps)]
        argv += ["--run-dir", str(run_dir), "--no-summary"]
        argv += [x for kv in args.set for x in ("--set", kv)]
        first = run_train(argv, run_dir)
        out: dict[str, Any] = {
            "command": argv,
            "steps": args.steps,
            "first": first_figures(first, run_dir, args.steps),
        }
        if args.rerun:
            out["rerun"] = rerun_figures(run_train(argv, run_dir), first, run_dir)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print_table(out)


if __name__ == "__main__":
    main()
