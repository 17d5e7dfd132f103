"""The ``evosteer`` command: train, estimate, stage-data, evaluate, experiment, replay, report.

``train`` and ``evaluate`` run the Flyte workflows in-process (flytekit local execution, with
its task cache: re-running resumes); ``estimate`` prints what a train would use and cost;
``stage-data`` stores a config's benchmark files and writes the config naming them by ref;
``replay`` recomputes one step and compares it artifact by artifact; ``report`` writes an
HTML report. Contract relied on by scripts and auditors:

* ``evosteer train --config FILE [--steps N] [--run-dir DIR]`` prints the run id on its last
  line; stopped by its run budget (``budget.run_cost``) it prints one line saying so and how
  to continue, and exits 3;
* ``evosteer replay --run-dir DIR --run RUN --step K`` exits 0 iff every artifact of step K is
  identical, 1 when one differs (naming each differing artifact), 2 when it cannot replay;
* a command that fails prints one line ``evosteer <command>: <what failed>`` on stderr
  (``--debug`` shows the traceback instead) and exits 2 for a usage or input error (a bad
  option, a missing config file, a bad config key or value, which names the file or the
  ``--set KEY=VALUE`` it came from, a run or step that does not exist) and 1 for a failure
  while running; a store failure names the store root and the operation; a second ``train``
  of a run that is being trained refuses at once;
* the terminal shows one progress bar and our warnings; the rest goes to the run's log file
  (:mod:`evosteer_flyte.console`).

Flyte (``workflows``/``tasks``) is imported only inside the commands that run a workflow;
this module itself imports no flytekit.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore, RunIndex, open_store
from evosteer_core.infra.config import DEFAULT_PRESET, RunConfig, config_from_dict, load_config
from evosteer_core.infra.configio import ConfigError, InputError, parse_override, parse_yaml
from evosteer_core.infra.locks import run_lock, run_log_path
from evosteer_core.infra.runs import run_config, run_id_for
from evosteer_core.infra.tracking import closing_on_failure
from evosteer_core.pipeline.costs import (
    RunBudgetReached,
    estimate,
    estimate_lines,
    require_priced,
)
from evosteer_flyte.console import (
    CellProgress,
    StepProgress,
    cause_chain,
    error_line,
    quiet_libraries,
    run_log,
)

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    from evosteer_core.experiment.cells import Cell


class UsageError(InputError):
    """The command line asks for what cannot be (a missing file, run or step, a malformed
    ``--set``); the message names the option."""


BUDGET_STOP_EXIT = 3
"""``train`` stopped at a step boundary by ``budget.run_cost`` (resumable)."""


def _budget_stop(exc: BaseException) -> RunBudgetReached | None:
    return next((e for e in cause_chain(exc) if isinstance(e, RunBudgetReached)), None)


def exit_status(command: str, exc: BaseException) -> int:
    """2 for a usage or input error (an :class:`InputError` anywhere in the cause chain) and
    for any failure of ``replay`` (whose 1 means "an artifact differs"); 3 for a train stopped
    by its run budget; else 1."""
    if any(isinstance(seen, InputError) for seen in cause_chain(exc)):
        return 2
    if _budget_stop(exc) is not None:
        return BUDGET_STOP_EXIT
    return 2 if command == "replay" else 1


def _overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The dotted overrides of ``--set``, ``--steps`` and ``--run-dir``, and for each key the
    option that set it (what a config error about that key blames)."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for text in args.set:
        try:
            key, value = parse_override(text)
        except ConfigError as exc:
            raise UsageError(f"--set {text}: {exc.problem}") from None
        values[key], origins[key] = value, f"--set {text}"
    if getattr(args, "steps", None) is not None:
        values["train.steps"], origins["train.steps"] = args.steps, f"--steps {args.steps}"
    if getattr(args, "run_dir", None) and args.command in ("train", "estimate", "stage-data"):
        values["store.root"], origins["store.root"] = args.run_dir, f"--run-dir {args.run_dir}"
    return values, origins


def _blame(exc: ConfigError, origins: Mapping[str, str]) -> InputError:
    """A config error about a key an option set, as that option's error (``--set
    train.batch_size=abc: expected int, found str 'abc'``); a section's check across keys
    that options set names the file and those options; any other error as it is."""
    for key, origin in origins.items():
        if exc.path == key:
            return UsageError(f"{origin}: {exc.problem}")
        if exc.path.startswith((f"{key}.", f"{key}[")):
            return UsageError(f"{origin}: {exc.path}: {exc.problem}")
    inside = [origin for key, origin in origins.items() if key.startswith(f"{exc.path}.")]
    if inside:
        return UsageError(f"{exc.source} with {' '.join(inside)}: {exc.path}: {exc.problem}")
    return exc


def _build(load: Callable[[Mapping[str, Any]], RunConfig], args: argparse.Namespace) -> RunConfig:
    values, origins = _overrides(args)
    try:
        return load(values)
    except ConfigError as exc:
        blamed = _blame(exc, origins)
        if blamed is exc:
            raise
        raise blamed from exc


def _source(args: argparse.Namespace) -> str:
    """What a config error about the whole config names: the file, or the embedded preset."""
    return args.config or f"evosteer_core/data/{DEFAULT_PRESET}"


def _config(args: argparse.Namespace) -> RunConfig:
    """The run config of ``train``: ``--config`` (default: the embedded preset) and the
    options' overrides."""
    path = args.config
    if path is not None and not Path(path).is_file():
        what = "is a directory" if Path(path).is_dir() else "no such file"
        raise UsageError(
            f"--config {path}: {what} (expected a YAML run config, e.g. configs/tiny-sim.yaml)"
        )
    return _build(lambda overrides: load_config(path, overrides), args)


def _open_run(run_dir: str, run_id: str, step: int | None = None) -> ArtifactStore:
    """The store of ``--run-dir`` after checking that ``--run`` (and ``--step``) exist there."""
    store = open_store(run_dir)
    try:
        steps = RunIndex(store, run_id).steps()
    except ValueError as exc:  # a run id that cannot be one (RunIndex checks the name)
        raise UsageError(f"--run {run_id}: {exc}") from None
    if not steps:
        runs = sorted({key.split("/")[1] for key in store.list_entries("index")})
        there = f"runs there: {', '.join(runs)}" if runs else "no runs there"
        raise UsageError(f"--run {run_id}: no such run in {store.root} ({there})")
    if step is not None and step not in steps:
        raise UsageError(
            f"--step {step}: run {run_id} has no step {step} (recorded: {steps[0]}–{steps[-1]})"
        )
    return store


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
    require_priced(cfg, _source(args))

    run_id = run_id_for(cfg)
    index = RunIndex(open_store(cfg.store.root, cfg.store.s3_endpoint), run_id)
    started = time.perf_counter()
    log_path = run_log_path(cfg.store.root, run_id)
    with run_lock(cfg.store.root, run_id), run_log(log_path, args.argv) as log_file:
        index.steps()  # an unreachable or unusable store fails here, before any task runs
        with (
            StepProgress(index, cfg.train.steps, cfg),
            _terminate_as_exit(),
            closing_on_failure(cfg, run_id, "train", stopped=_budget_stop),
        ):
            out = train(config_yaml=cfg.to_yaml(), steps=cfg.train.steps)
    elapsed = time.perf_counter() - started
    simulated = " (SIMULATED executor)" if cfg.executor.kind == "sim" else ""
    summary = []
    if cfg.executor.kind == "sim" and args.heldout_summary:
        summary = _heldout_summary(cfg, out.state)
    lines = [
        f"Trained {cfg.train.steps} steps of {cfg.name}{simulated} in {elapsed:.1f} s.",
        *summary,
        f"Artifact root:  {cfg.store.root}",
        f"Final state:    {out.state.sha256}",
        *_tracking_summary(cfg, out.mlflow_run),
        f"Replay a step:  evosteer replay --run-dir {cfg.store.root} --run {run_id} --step 1",
        f"Report:         evosteer report --run-dir {cfg.store.root} --run {run_id}",
        *([f"Log file:       {log_file}"] if log_file else []),
        run_id,
    ]
    print("\n".join(lines))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from evosteer_core.episode.world import stage_data

    cfg = stage_data(_config(args))  # as train does: the run id holds the tables' hashes
    require_priced(cfg, _source(args))  # what train would refuse, estimate refuses too
    run_id = run_id_for(cfg)
    est = estimate(cfg, open_store(cfg.store.root, cfg.store.s3_endpoint), run_id)
    print("\n".join(estimate_lines(cfg, est)))
    return 0


def cmd_stage_data(args: argparse.Namespace) -> int:
    from evosteer_core.episode.world import staged_config

    cfg = _config(args)
    if cfg.data.source == "sim":
        print(f"{_source(args)}: data.source is sim: no benchmark files to stage", file=sys.stderr)
    staged = staged_config(cfg)
    for split in ("train", "heldout"):
        pairs = zip(getattr(cfg.data, split), getattr(staged.data, split), strict=True)
        for i, (before, after) in enumerate(pairs):
            origin = (before.path or "its packaged data") if before.ref is None else "the store"
            print(
                f"data.{split}[{i}] {before.name}: {origin} -> {after.ref.uri} "
                f"(sha256 {after.ref.sha256[:12]})",
                file=sys.stderr,
            )
    text = staged.to_yaml()
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out} (run {run_id_for(staged)})", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def _heldout_summary(cfg: RunConfig, state: ArtifactRef) -> list[str]:
    """θ vs ρ and the best fixed paradigm on the held-out sim tasks (one run, paired)."""
    from evosteer_core.evaluation.heldout_summary import heldout_summary
    from evosteer_core.pipeline.stage_io import StepStore

    store = open_store(cfg.store.root, cfg.store.s3_endpoint)
    if cfg.policy.init is not None and cfg.policy.init.ref is None:  # the run's warm start
        from evosteer_core.training.warm_start import with_warm_start
        from evosteer_flyte.tasks.tracking_tasks import WARM_START_ENTRY

        warm = RunIndex(store, run_id_for(cfg)).lookup(0, WARM_START_ENTRY)
        cfg = with_warm_start(cfg, warm)
    return heldout_summary(cfg, StepStore(store).get_state(state)).lines(simulated=True)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from evosteer_flyte.workflows.evaluate import evaluate

    rows = _rows(args.rows)
    store = _open_run(args.run_dir, args.run, args.step)
    recorded = run_config(store, args.run).to_dict()
    source = f"{args.run}/config.yaml"
    cfg = _build(
        lambda sets: config_from_dict(recorded, source, {"store.root": args.run_dir, **sets}),
        args,
    )
    index = RunIndex(store, args.run)
    step = args.step if args.step is not None else max(index.steps())
    state = index.lookup(step, "state")
    names, paths = [], []
    for item in args.benchmark:
        name, _, path = item.partition("=")
        names.append(name)
        paths.append(path)
    search = {
        key: value
        for key, value in (
            ("candidates", args.search_candidates),
            ("tasks_per_family", args.search_tasks),
        )
        if value is not None
    }
    with run_log(run_log_path(args.run_dir, args.run), args.argv):
        out = evaluate(
            config_yaml=cfg.to_yaml(),
            state=state,
            benchmarks=names,
            paths=paths,
            runs=args.runs,
            rows=rows,
            search=search,
        )
    from evosteer_core.infra.artifacts import get_json

    table = get_json(store, out.table)
    print(f"Checkpoint: run {args.run} step {step} ({state.sha256[:12]}); {args.runs} runs each")
    if rows:
        from evosteer_core.evaluation.row_summary import costs_markdown, scores_markdown

        print("Scores (mean ± sample std over runs, %):")
        print(scores_markdown(table))
        print("Tokens per item (all benchmarks):")
        print(costs_markdown(table))
    else:
        for row in table["benchmarks"] + table["groups"]:
            print(f"  {row['name']:<20} {100 * row['mean']:6.2f} ± {100 * row['std']:.2f}")
    print(f"Table artifact: {out.table.uri}")
    print("\n".join(_tracking_summary(cfg, out.mlflow_run)))
    return 0


def _cell_job(config_yaml: str, row: str, seed: int) -> str:
    """One cell of an experiment in a worker process (``--jobs``, one torch thread): its runs
    land in the task cache and the store, where the experiment workflow then finds them."""
    import torch

    quiet_libraries()
    torch.set_num_threads(1)
    return _run_cell(config_yaml, row, seed)


def _run_cell(config_yaml: str, row: str, seed: int) -> str:
    """Run the cell (``row``, ``seed``) of the experiment ``config_yaml``; its label."""
    from evosteer_core.experiment.cells import experiment_cells
    from evosteer_flyte.workflows.experiment import run_cell

    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    (cell,) = (c for c in experiment_cells(cfg) if c.row.name == row and c.seed == seed)
    with CellProgress(cell.label, cell.config.train.steps if cell.row.trained else 0):
        run_cell(cfg, cell, mlflow_run="")
    return cell.label


def _run_cells(config_yaml: str, cells: Sequence[Cell], jobs: int) -> Iterator[str]:
    """Run every cell (in this process, or ``jobs`` worker processes at once), longest first,
    yielding each cell's label when it is done."""
    from evosteer_core.experiment.cells import longest_first

    order = longest_first(cells)
    if jobs == 1:
        for cell in order:
            yield _run_cell(config_yaml, cell.row.name, cell.seed)
        return
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [pool.submit(_cell_job, config_yaml, c.row.name, c.seed) for c in order]
        try:
            for future in concurrent.futures.as_completed(futures):
                yield future.result()
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            _stop_workers(pool)
            raise


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """An interrupted experiment (Ctrl-C, SIGTERM as ``SystemExit``, or its caller gone) stops
    now: queued cells are cancelled and running ones end with their worker (SIGTERM), instead of
    the pool's exit waiting for every cell to finish. A stopped cell resumes from its last
    cached step when the command runs again; its MLflow run is closed by that next start."""
    import multiprocessing

    pool.shutdown(wait=False, cancel_futures=True)
    for worker in multiprocessing.active_children():
        worker.terminate()


def cmd_experiment(args: argparse.Namespace) -> int:
    from evosteer_core.episode.world import stage_data
    from evosteer_core.experiment.cells import experiment_cells, experiment_id
    from evosteer_core.infra.artifacts import get_json
    from evosteer_flyte.workflows.experiment import experiment

    cfg = stage_data(_config(args))
    cells = experiment_cells(cfg, args.config)  # every row's config is checked here
    exp = cfg.experiment
    exp_id = experiment_id(cfg)
    config_yaml = cfg.to_yaml()
    started = time.perf_counter()
    trained = sum(c.row.trained for c in cells)
    print(
        f"Experiment {exp_id}: {len(exp.rows)} rows × {len(exp.seeds)} seeds = {len(cells)} "
        f"cells ({trained} trained), {exp.runs} evaluation runs each",
        flush=True,
    )
    with (
        run_lock(cfg.store.root, exp_id),
        run_log(run_log_path(cfg.store.root, exp_id), args.argv) as log_file,
        _terminate_as_exit(),
        closing_on_failure(cfg, exp_id, "experiment"),
    ):
        for k, label in enumerate(_run_cells(config_yaml, cells, args.jobs), 1):
            elapsed = time.perf_counter() - started
            print(f"  [{k}/{len(cells)}] {label}: done ({elapsed:.0f} s)", flush=True)
        out = experiment(config_yaml=config_yaml)
    store = open_store(cfg.store.root, cfg.store.s3_endpoint)
    table = get_json(store, out.table)
    lines = ["", table["markdown"], "", f"Table artifact: {out.table.uri}"]
    if "://" not in cfg.store.root:
        page = Path(cfg.store.root) / f"experiment-{exp_id}.html"
        page.write_bytes(store.get_bytes(ArtifactRef(**table["html"])))
        lines.append(f"HTML:           {page}")
    lines += [
        *_tracking_summary(cfg, out.mlflow_run),
        *([f"Log file:       {log_file}"] if log_file else []),
        f"Took {time.perf_counter() - started:.0f} s.",
        exp_id,
    ]
    print("\n".join(lines))
    return 0


def _rows(items: Sequence[str]) -> list[str]:
    """``--rows`` as row names; an unknown name is a usage error. Only ``checkpoint``, or
    none, is the plain evaluation (today's output)."""
    from evosteer_core.evaluation.rows import RowError, parse_rows

    try:
        rows = parse_rows(items)
    except RowError as exc:
        raise UsageError(f"--rows: {exc}") from None
    return [] if rows == ["checkpoint"] else rows


def cmd_replay(args: argparse.Namespace) -> int:
    from evosteer_flyte.workflows.replay import replay

    _open_run(args.run_dir, args.run, args.step)
    with run_log(None, args.argv):  # replay writes nothing, not even a log file
        result = replay(store_root=args.run_dir, run_id=args.run, step=args.step)
    for line in result.lines:
        print(line)
    if result.identical:
        print(f"step {args.step} of {args.run}: every artifact identical")
        return 0
    print(f"step {args.step} of {args.run}: differing artifacts: {', '.join(result.differing)}")
    return 1


def cmd_report(args: argparse.Namespace) -> int:
    from evosteer_core.pipeline.report import load_report, render_html

    store = _open_run(args.run_dir, args.run)
    report = load_report(store, args.run, args.run_dir)
    out = Path(args.out or Path(args.run_dir) / f"report-{args.run}.html")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report), encoding="utf-8")
    print(f"wrote {out} ({len(report.history)} steps)")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``evosteer train: argument --steps: expected an integer
    ≥ 1, found '0' (see evosteer train --help)``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer ≥ ``low`` (``--steps 0`` is an error, not "all steps")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an integer ≥ {low}, found {text!r}")
        return value

    return parse


def _version() -> str:
    try:
        return metadata.version("evosteer")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


SET_HELP = "override any config key, e.g. --set train.batch_size=6 (repeatable)"


def _config_options(p: argparse.ArgumentParser, steps: str | None, run_dir: str) -> None:
    """The options a command builds its run config from (:func:`_config`): ``--config``,
    ``--steps`` (with help ``steps``; None: the command has none), ``--run-dir``, ``--set``."""
    p.add_argument("--config", default=None, help="YAML config (default: embedded tiny-sim)")
    if steps is not None:
        p.add_argument("--steps", type=_int_at_least(1), default=None, help=steps)
    p.add_argument("--run-dir", default=None, help=run_dir)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)


def build_parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on failure, show the full traceback instead of one line",
    )
    p = _Parser(prog="evosteer", description=__doc__.split("\n\n")[0], parents=[debug])
    p.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="print the version"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_dir_help = "artifact store root of the run (a folder or s3://bucket/prefix)"
    run_help = "run id (the last line train printed)"

    t = sub.add_parser(
        "train", help="run the train workflow (resumes from the task cache)", parents=[debug]
    )
    store_help = "artifact store root (store.root)"
    _config_options(t, "train this many steps (train.steps)", store_help)
    t.add_argument(
        "--no-summary",
        dest="heldout_summary",
        action="store_false",
        help="skip the closing θ vs ρ vs best paradigm comparison on held-out sim tasks",
    )
    t.set_defaults(func=cmd_train)

    c = sub.add_parser(
        "estimate",
        help="tokens, stage hours and cost of a train before it runs (docs/costs.md)",
        parents=[debug],
    )
    _config_options(
        c, "estimate this many steps", f"{store_help}: where measured steps of the run are"
    )
    c.set_defaults(func=cmd_estimate)

    d = sub.add_parser(
        "stage-data",
        help="store the config's benchmark files; write a config naming them by ref",
        parents=[debug],
    )
    _config_options(d, None, f"{store_help}: where the tables are stored")
    d.add_argument(
        "--out", default=None, help="YAML file to write the staged config to (default: stdout)"
    )
    d.set_defaults(func=cmd_stage_data)

    e = sub.add_parser(
        "evaluate", help="checkpoint × benchmarks × runs → means ± std", parents=[debug]
    )
    e.add_argument("--run-dir", required=True, help=run_dir_help)
    e.add_argument("--run", required=True, help=run_help)
    e.add_argument(
        "--step", type=_int_at_least(0), default=None, help="checkpoint step (default: the last)"
    )
    e.add_argument(
        "--runs", type=_int_at_least(1), default=5, help="runs per benchmark (default: 5)"
    )
    e.add_argument(
        "--benchmark",
        action="append",
        default=[],
        metavar="NAME[=PATH]",
        help="benchmark and its JSONL file (default: the six sim families)",
    )
    e.add_argument(
        "--rows",
        action="append",
        default=[],
        metavar="ROW[,ROW...]",
        help="rows to compare on the same records and seeds: checkpoint, untrained, direct, "
        "paradigm:react, paradigm:template, paradigm:plan_execute, paradigm:searched, "
        "paradigm:random (default: checkpoint; docs/paradigms.md)",
    )
    e.add_argument(
        "--search-candidates",
        type=_int_at_least(0),
        default=None,
        help="paradigm:searched: sampled teams per family beside the 3 seed teams (default 16)",
    )
    e.add_argument(
        "--search-tasks",
        type=_int_at_least(1),
        default=None,
        help="paradigm:searched: training records per family each team runs on (default 16)",
    )
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser(
        "experiment",
        help="rows × seeds of runs, trained and evaluated alike → a paired comparison table",
        parents=[debug],
    )
    x.add_argument("--config", required=True, help="YAML config with an experiment section")
    x.add_argument(
        "--jobs",
        type=_int_at_least(1),
        default=1,
        help="cells (row × seed) run in this many processes at once, trained cells first "
        "(default: 1, in this process; with more, one torch thread each)",
    )
    x.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    x.set_defaults(func=cmd_experiment)

    r = sub.add_parser(
        "replay",
        help="recompute one step; exit 0 identical, 1 an artifact differs, 2 cannot replay",
        parents=[debug],
    )
    r.add_argument("--run-dir", required=True, help=run_dir_help)
    r.add_argument("--run", required=True, help=run_help)
    r.add_argument(
        "--step", type=_int_at_least(1), required=True, help="the step to recompute and compare"
    )
    r.set_defaults(func=cmd_replay)

    h = sub.add_parser("report", help="HTML report with plots", parents=[debug])
    h.add_argument("--run-dir", required=True, help=run_dir_help)
    h.add_argument("--run", required=True, help=run_help)
    h.add_argument(
        "--out", default=None, help="HTML file to write (default: <run-dir>/report-<run>.html)"
    )
    h.set_defaults(func=cmd_report)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    quiet_libraries()
    if getattr(args, "debug", False):
        return args.func(args)
    try:
        return args.func(args)
    except Exception as exc:
        print(f"evosteer {args.command}: {error_line(exc)}", file=sys.stderr)
        return exit_status(args.command, exc)


def run() -> None:
    """The ``evosteer`` command: :func:`main`, then exit without the interpreter's last
    collections over every object the command made (``gc.freeze``): they took 4-5 s after a
    20-step train and ~30 s after 240 steps, and nothing left to flush lives in a reference
    cycle (the logs, MLflow and the store are closed or committed by then; ``atexit``
    handlers still run). In-process callers use :func:`main`, which leaves the collector be."""
    status = main()
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    run()
