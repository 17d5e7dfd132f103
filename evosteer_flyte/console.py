"""What the person at the terminal sees while a command runs, and where the rest goes.

Quiet by default: one progress bar for a training run (:class:`StepProgress`), our own
warnings as one line each, and everything else — INFO records of our modules (which stage
runs, what the backbone loading said), the libraries' warnings and log records, the
traceback of a failure — in the run's log file (:func:`run_log`; the path is `infra.locks.run_log_path`).
docs/pipeline.md, "The terminal and the log file", says what goes where.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from evosteer_core.executors.breaker import ExecutorOutageError
from evosteer_core.infra.artifacts import MissingArtifactError, RunIndex, StoreError
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.configio import InputError
from evosteer_core.infra.locks import RunInUseError
from evosteer_core.pipeline.costs import RunBudgetReached, money, step_usage
from evosteer_core.pipeline.usage import UsageLog

OUR_LOGGERS = ("evosteer_core", "evosteer_flyte")
"""The loggers whose warnings are shown on the terminal (the libraries' go to the file)."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_log = logging.getLogger(__name__)


_FLYTE_PREFIX = re.compile(r"Error encountered while executing '([^']+)':\s*")
"""How flytekit's local execution prefixes the message of an exception raised in a task."""

_CLEAR_ERRORS = (StoreError, RunInUseError, InputError)
"""Errors whose message already says what failed and where (printed without their type)."""


def cause_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes: the chain Python itself would print (an explicit cause, else an
    unsuppressed context), each exception once."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        yield seen
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)


def error_line(exc: BaseException) -> str:
    """One line for a failed command: a store failure (anywhere in the cause chain) as the
    store root, operation and cause; an executor outage or a run budget stop as its message; anything else as its
    type, the innermost Flyte task it failed in, and its message without flytekit's prefixes."""
    for seen in cause_chain(exc):
        if isinstance(seen, StoreError):
            return seen.line
        if isinstance(seen, ExecutorOutageError | RunBudgetReached):
            return _FLYTE_PREFIX.sub("", " ".join(str(seen).split()))
    message = " ".join(str(exc).split())
    tasks = _FLYTE_PREFIX.findall(message)
    message = _FLYTE_PREFIX.sub("", message)
    if isinstance(exc, _CLEAR_ERRORS):
        return message
    where = f" in task {tasks[-1]}" if tasks else ""
    return f"{type(exc).__name__}{where}: {message or 'no message'}"


def quiet_libraries() -> None:
    """Keep the libraries' own console handlers to errors. Set through the environment where a
    library reads its level when it is imported (MLflow, transformers), so this works whether
    or not they are imported yet."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("FLYTE_SDK_LOGGING_LEVEL", "40")
    for name in ("flytekit", "mlflow", "alembic", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


class _Terminal(logging.Handler):
    """Our warnings and errors as ``warning: <message>`` lines written around the progress bar
    (``tqdm.write``); a record marked ``terminal=False`` (a traceback meant for the file) and
    everything from other loggers are left to the file."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name.split(".", 1)[0] in OUR_LOGGERS
        return ours and getattr(record, "terminal", True)

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(f"{record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)
        except Exception:  # noqa: BLE001 - a log line must not fail the run
            self.handleError(record)


@contextmanager
def run_log(path: Path | None, argv: Sequence[str]) -> Iterator[Path | None]:
    """Route logging for one command: INFO and above of every logger, and Python warnings, to
    ``path`` (appended; None or a file that cannot be created: no file), our warnings to the
    terminal. A failure's traceback is written to the file before it propagates. Yields the
    file's path, or None. Everything is undone on exit (the CLI also runs inside tests)."""
    root = logging.getLogger()
    handlers: list[logging.Handler] = [_Terminal()]
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handlers.append(logging.FileHandler(path, encoding="utf-8"))
            handlers[-1].setFormatter(logging.Formatter(LOG_FORMAT))
        except OSError as exc:
            path = None
            _log.warning("no log file: %s", exc)
    level = root.level
    root.setLevel(logging.INFO)
    for handler in handlers:
        root.addHandler(handler)
    logging.captureWarnings(True)
    try:
        _log.info("evosteer %s (pid %d)", " ".join(argv), os.getpid())
        yield path
    except BaseException:
        _log.error("failed", exc_info=True, extra={"terminal": False})
        raise
    finally:
        logging.captureWarnings(False)
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)


def _listen(handler: logging.Handler) -> dict[str, int]:
    """Add ``handler`` to our loggers, at INFO at least (the stage records are INFO); their
    levels before, for :func:`_stop_listening`."""
    levels = {}
    for name in OUR_LOGGERS:
        logger = logging.getLogger(name)
        levels[name] = logger.level
        if not logger.isEnabledFor(logging.INFO):
            logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    return levels


def _stop_listening(handler: logging.Handler, levels: dict[str, int]) -> None:
    for name, level in levels.items():
        logging.getLogger(name).removeHandler(handler)
        logging.getLogger(name).setLevel(level)


class CellProgress(logging.Handler):
    """Progress of one experiment cell's training as plain lines (cells run side by side in
    worker processes, where bars would overwrite each other): ``<label>: step k/N (s since the
    cell began)`` when a step's first stage starts in a new tenth of the run, so a cell of an
    hour shows about ten lines. Steps found in the cache run no stage and print nothing."""

    def __init__(self, label: str, total: int) -> None:
        super().__init__(logging.INFO)
        self.label, self.total = label, total
        self.started = time.perf_counter()
        self.shown = -1
        """The last tenth of the run a line was printed for."""

    def emit(self, record: logging.LogRecord) -> None:
        step = getattr(record, "step", None)
        if getattr(record, "stage", None) is None or not isinstance(step, int) or self.total < 1:
            return
        tenth = 10 * step // self.total
        if tenth > self.shown:
            self.shown = tenth
            elapsed = time.perf_counter() - self.started
            print(f"  {self.label}: step {step}/{self.total} ({elapsed:.0f} s)", flush=True)

    def __enter__(self) -> CellProgress:
        self.levels = _listen(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stop_listening(self, self.levels)


class StepProgress(logging.Handler):
    """One tqdm bar for a training run: steps done of the total, s/step and ETA (tqdm's own),
    the stage now running and the last finished step's mean rewards under θ and ρ, plus its
    rollout health when some trajectories hit an infrastructure failure, and (given the
    config) the run's spend so far and its budget.

    The stage comes from the INFO record that ``stage_io.run_stage`` logs as a stage starts
    (this object is a logging handler on our loggers while the bar is open); finished steps
    and their metrics from polling the run index once a second: the first poll lists the
    steps recorded so far, later ones look up only the next step's state (``record_step``
    records it last), so a poll's work does not grow with the run, and each step's spend is
    read once. Only a display, so it never
    raises: a failed listing (store unreachable, ...) shows as the postfix until a listing
    succeeds again; the workflow reports its own failure."""

    def __init__(self, index: RunIndex, total: int, cfg: RunConfig | None = None) -> None:
        from tqdm import tqdm

        super().__init__(logging.INFO)
        self.index = index
        self.cfg = cfg
        """The run's config: with it, the summary adds the spend so far (``costs.run_spend``)."""
        self.bar = tqdm(total=total, desc="train", unit="step", file=sys.stderr)
        self.ticking = sys.stderr.isatty()
        """Redraw every poll on a terminal; elsewhere (a CI log) only when something changed."""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.bar_lock = threading.Lock()
        self.now = ""
        """The stage running now (``step 3 rescore``)."""
        self.last: tuple[int, str] = (0, "")
        """(step, summary) of the latest finished step read so far."""
        self.recorded: set[int] | None = None
        """The finished steps 1..total: the first poll's listing, then each next step whose
        state the index holds (None: not listed yet)."""
        self.step_costs: dict[int, float] = {}
        """Each finished step's priced usage (``costs.step_usage``), read once."""
        self.levels: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        stage = getattr(record, "stage", None)
        if stage is not None:
            self.now = f"step {getattr(record, 'step', '?')} {stage}"
            self._show()

    def _poll(self) -> None:
        while not self.done.wait(1.0):
            self._update()

    def _update(self) -> None:
        try:
            done = self._recorded()
            if done and max(done) != self.last[0]:
                self.last = (max(done), self._summary(max(done)))
        except Exception as exc:  # noqa: BLE001 - a display must not fail the run
            with self.bar_lock:
                self.bar.set_postfix_str(f"progress unavailable: {error_line(exc)}")
            return
        with self.bar_lock:
            if len(done) != self.bar.n:
                self.bar.update(len(done) - self.bar.n)
            elif self.ticking:
                self.bar.refresh()  # the elapsed time and ETA move on
        self._show()

    def _show(self) -> None:
        text = " · ".join(t for t in (self.now, self.last[1]) if t)
        with self.bar_lock:
            if text != self.bar.postfix:
                self.bar.set_postfix_str(text)

    def _recorded(self) -> list[int]:
        """The finished steps: listed once, then each next step's state looked up."""
        if self.recorded is None:
            self.recorded = {s for s in self.index.steps() if 1 <= s <= self.bar.total}
        step = max(self.recorded, default=0) + 1
        while step <= self.bar.total:
            try:
                self.index.lookup(step, "state")
            except MissingArtifactError:
                break
            self.recorded.add(step)
            step += 1
        return sorted(self.recorded)

    def _spent(self, cfg: RunConfig, step: int) -> float:
        """The run's spend through ``step`` (``costs.run_spend``), each step's records read once."""
        usage = UsageLog(self.index.store, self.index.run_id)
        for k in range(1, step + 1):
            if k not in self.step_costs:
                self.step_costs[k] = step_usage(cfg, usage.step(k)).cost
        return sum(self.step_costs[k] for k in range(1, step + 1))

    def _summary(self, step: int) -> str:
        from evosteer_core.pipeline.stage_io import StepStore, step_metrics

        m = step_metrics(StepStore(self.index.store), self.index.step_artifacts(step))
        text = f"step {step}: θ {m['reward_theta']:.3f} ρ {m['reward_rho']:.3f}"
        if m["infra_failures"]:
            text += (
                f" infra_failures={m['infra_failures']:.0f}"
                f" healthy_fraction={m['healthy_fraction']:.2f}"
            )
        if self.cfg is not None:
            spent = self._spent(self.cfg, step)
            budget = self.cfg.budget.run_cost
            text += f" · spent {money(self.cfg, spent)}"
            text += "" if budget is None else f" of {money(self.cfg, budget)}"
        return text

    def __enter__(self) -> StepProgress:
        self.levels = _listen(self)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        _stop_listening(self, self.levels)
        self.now = ""
        self._update()
        self.bar.close()
