"""The ``evosteer`` command: train, evaluate, replay, report.

``train`` and ``evaluate`` run the Flyte workflows in-process (flytekit local execution, with
its task cache: re-running resumes); ``replay`` recomputes one step and compares it artifact by
artifact; ``report`` writes an HTML report. Contract relied on by scripts and auditors:

* ``evosteer train --config FILE [--steps N] [--run-dir DIR]`` prints the run id on its last line;
* ``evosteer replay --run-dir DIR --run RUN --step K`` exits 0 iff every artifact of step K is
  identical, else 1, naming each differing artifact;
* a command that fails prints one line ``evosteer <command>: <what failed>`` on stderr and exits
  1 (``--debug`` shows the traceback instead); a store failure names the store root and the
  operation; a second ``train`` of a run that is being trained refuses at once.

Flyte (``workflows``/``tasks``) is imported only inside the commands that run a workflow;
this module itself imports no flytekit.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from evosteer_core.executors.breaker import ExecutorOutageError
from evosteer_core.infra.artifacts import RunIndex, StoreError, open_store
from evosteer_core.infra.config import RunConfig, load_config
from evosteer_core.infra.configio import InputError, parse_override
from evosteer_core.infra.locks import RunInUseError, run_lock
from evosteer_core.infra.runs import run_config, run_id_for
from evosteer_core.infra.tracking import closing_on_failure


def _quiet_libraries() -> None:
    import logging
    import os

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("FLYTE_SDK_LOGGING_LEVEL", "40")
    for name in ("flytekit", "mlflow", "alembic", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


_FLYTE_PREFIX = re.compile(r"Error encountered while executing '([^']+)':\s*")
"""How flytekit's local execution prefixes the message of an exception raised in a task."""

_CLEAR_ERRORS = (StoreError, RunInUseError, InputError)
"""Errors whose message already says what failed and where (printed without their type)."""


def error_line(exc: BaseException) -> str:
    """One line for a failed command: a store failure (anywhere in the cause chain) as the
    store root, operation and cause; an executor outage as its message; anything else as its
    type, the innermost Flyte task it failed in, and its message without flytekit's prefixes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StoreError):
            return seen.line
        if isinstance(seen, ExecutorOutageError):
            return str(seen)
        # the chain Python itself would print: an explicit cause, else an unsuppressed context
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    message = " ".join(str(exc).split())
    tasks = _FLYTE_PREFIX.findall(message)
    message = _FLYTE_PREFIX.sub("", message)
    if isinstance(exc, _CLEAR_ERRORS):
        return message
    where = f" in task {tasks[-1]}" if tasks else ""
    return f"{type(exc).__name__}{where}: {message or 'no message'}"


class _StepProgress:
    """A tqdm bar over training steps, driven by polling the run index while a workflow runs.

    The postfix shows the latest finished step's rollout health (``infra_failures``,
    ``healthy_fraction``). Only a display, so it never raises: a failed listing (store
    unreachable, ...) shows as the postfix until a listing succeeds again; the workflow reports
    its own failure."""

    def __init__(self, index: RunIndex, total: int) -> None:
        from tqdm import tqdm

        self.index = index
        self.bar = tqdm(total=total, desc="train steps", unit="step", file=sys.stderr)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.health: tuple[int, str] = (0, "")
        """(step, postfix) of the latest finished step read so far."""

    def _poll(self) -> None:
        while not self.done.wait(1.0):
            self._update()

    def _update(self) -> None:
        try:
            done = [s for s in self.index.steps() if s >= 1 and s <= self.bar.total]
            if done and max(done) != self.health[0]:
                self.health = (max(done), self._health(max(done)))
        except Exception as exc:  # a display must not fail the run nor print a traceback
            self.bar.set_postfix_str(f"progress unavailable: {error_line(exc)}")
            return
        self.bar.set_postfix_str(self.health[1])
        self.bar.update(len(done) - self.bar.n)

    def _health(self, step: int) -> str:
        from evosteer_core.episode.rollout import rollout_health
        from evosteer_core.pipeline.stage_io import StepStore

        traj = StepStore(self.index.store).get_table(self.index.lookup(step, "trajectories"))
        h = rollout_health(traj)
        return (
            f"step {step}: infra_failures={h['infra_failures']:.0f} "
            f"healthy_fraction={h['healthy_fraction']:.2f}"
        )

    def __enter__(self) -> _StepProgress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self._update()
        self.bar.close()


def _config(args: argparse.Namespace) -> RunConfig:
    overrides = dict(parse_override(text) for text in args.set)
    if getattr(args, "steps", None):
        overrides["train.steps"] = args.steps
    if args.run_dir:
        overrides["store.root"] = args.run_dir
    return load_config(args.config, overrides)


def _tracking_summary(cfg: RunConfig, mlflow_run: str) -> list[str]:
    from evosteer_core.infra.redact import redact_url
    from evosteer_core.infra.tracking import resolve_tracking

    if not mlflow_run:
        return ["MLflow:         tracking disabled (tracking.enabled: false)"]
    uri, _ = resolve_tracking(cfg.tracking, cfg.store)
    return [
        f"MLflow run:     {mlflow_run} (experiment {cfg.tracking.experiment})",
        f"MLflow UI:      mlflow ui --backend-store-uri {redact_url(uri)}",
    ]


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler stopping the job) raises ``SystemExit(143)`` in the main
    thread while a workflow runs, so its MLflow run is closed KILLED instead of left RUNNING."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_train(args: argparse.Namespace) -> int:
    from evosteer_core.episode.world import stage_data
    from evosteer_flyte.workflows.train import train

    # benchmark files go into the store first: the run id holds their tables' hashes
    cfg = stage_data(_config(args))

    run_id = run_id_for(cfg)
    index = RunIndex(open_store(cfg.store.root, cfg.store.s3_endpoint), run_id)
    started = time.perf_counter()
    with run_lock(cfg.store.root, run_id):
        index.steps()  # an unreachable or unusable store fails here, before any task runs
        with (
            _StepProgress(index, cfg.train.steps),
            _terminate_as_exit(),
            closing_on_failure(cfg, run_id, "train"),
        ):
            out = train(config_yaml=cfg.to_yaml(), steps=cfg.train.steps)
    elapsed = time.perf_counter() - started
    simulated = " (SIMULATED executor)" if cfg.executor.kind == "sim" else ""
    lines = [
        f"Trained {cfg.train.steps} steps of {cfg.name}{simulated} in {elapsed:.1f} s.",
        f"Artifact root:  {cfg.store.root}",
        f"Final state:    {out.state.sha256}",
        *_tracking_summary(cfg, out.mlflow_run),
        f"Replay a step:  evosteer replay --run-dir {cfg.store.root} --run {run_id} --step 1",
        f"Report:         evosteer report --run-dir {cfg.store.root} --run {run_id}",
        run_id,
    ]
    print("\n".join(lines))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from evosteer_flyte.workflows.evaluate import evaluate

    store = open_store(args.run_dir)
    cfg = run_config(store, args.run)
    overrides = {"store.root": args.run_dir, **dict(parse_override(t) for t in args.set)}
    from evosteer_core.infra.config import config_from_dict

    cfg = config_from_dict(cfg.to_dict(), f"{args.run}/config.yaml", overrides)
    index = RunIndex(store, args.run)
    step = args.step if args.step is not None else max(index.steps())
    state = index.lookup(step, "state")
    names, paths = [], []
    for item in args.benchmark:
        name, _, path = item.partition("=")
        names.append(name)
        paths.append(path)
    out = evaluate(
        config_yaml=cfg.to_yaml(), state=state, benchmarks=names, paths=paths, runs=args.runs
    )
    from evosteer_core.infra.artifacts import get_json

    table = get_json(store, out.table)
    print(f"Checkpoint: run {args.run} step {step} ({state.sha256[:12]}); {args.runs} runs each")
    for row in table["benchmarks"] + table["groups"]:
        print(f"  {row['name']:<20} {100 * row['mean']:6.2f} ± {100 * row['std']:.2f}")
    print(f"Table artifact: {out.table.uri}")
    print("\n".join(_tracking_summary(cfg, out.mlflow_run)))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from evosteer_flyte.workflows.replay import replay

    result = replay(store_root=args.run_dir, run_id=args.run, step=args.step)
    for line in result.lines:
        print(line)
    if result.identical:
        print(f"step {args.step} of {args.run}: every artifact identical")
        return 0
    print(f"step {args.step} of {args.run}: differing artifacts: {', '.join(result.differing)}")
    return 1


def cmd_report(args: argparse.Namespace) -> int:
    from evosteer_core.pipeline.report import render_html, run_history

    store = open_store(args.run_dir)
    cfg = run_config(store, args.run)
    history = run_history(store, args.run)
    out = Path(args.out or Path(args.run_dir) / f"report-{args.run}.html")
    out.write_text(render_html(history, args.run, cfg.executor.kind == "sim"), encoding="utf-8")
    print(f"wrote {out} ({len(history)} steps)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on failure, show the full traceback instead of one line",
    )
    p = argparse.ArgumentParser(
        prog="evosteer", description=__doc__.split("\n\n")[0], parents=[debug]
    )
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser(
        "train", help="run the train workflow (resumes from the task cache)", parents=[debug]
    )
    t.add_argument("--config", default=None, help="YAML config (default: embedded tiny-sim)")
    t.add_argument("--steps", type=int, default=None, help="override train.steps")
    t.add_argument("--run-dir", default=None, help="artifact store root (override store.root)")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set train.batch_size=6",
    )
    t.set_defaults(func=cmd_train)

    e = sub.add_parser(
        "evaluate", help="checkpoint × benchmarks × runs → means ± std", parents=[debug]
    )
    e.add_argument("--run-dir", required=True)
    e.add_argument("--run", required=True, help="run id (printed by train)")
    e.add_argument("--step", type=int, default=None, help="checkpoint step (default: last)")
    e.add_argument("--runs", type=int, default=5)
    e.add_argument(
        "--benchmark",
        action="append",
        default=[],
        metavar="NAME[=PATH]",
        help="benchmark and its JSONL file (default: the six sim families)",
    )
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    e.set_defaults(func=cmd_evaluate)

    r = sub.add_parser(
        "replay", help="recompute one step; exit 0 iff bit-identical", parents=[debug]
    )
    r.add_argument("--run-dir", required=True)
    r.add_argument("--run", required=True)
    r.add_argument("--step", type=int, required=True)
    r.set_defaults(func=cmd_replay)

    h = sub.add_parser("report", help="HTML report with plots", parents=[debug])
    h.add_argument("--run-dir", required=True)
    h.add_argument("--run", required=True)
    h.add_argument("--out", default=None)
    h.set_defaults(func=cmd_report)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    if getattr(args, "debug", False):
        return args.func(args)
    try:
        return args.func(args)
    except Exception as exc:
        print(f"evosteer {args.command}: {error_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
