"""Inter-process locks on local files (``fcntl.flock``).

A flock belongs to an open file: the kernel drops it when the holder exits, even on ``kill -9``,
so a lock file left on disk never blocks anyone (no stale locks, nothing to clean up). Two uses:

* :func:`run_lock` — one ``evosteer train`` per run: a second train of the same run id in the
  same store refuses at once, naming the holder (so one run id never gets two concurrent
  MLflow runs or two processes racing on the same steps);
* :func:`file_lock` — a short wait-for-it lock, e.g. around MLflow's SQLite schema migration
  and experiment creation, which are not safe to run from two processes at once.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from evosteer_core.infra.artifacts import StoreError

LOCK_POLL_S = 0.05


class RunInUseError(RuntimeError):
    """Another process is training the same run (same store root, same run id)."""


def _open_lock_file(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float = 300.0) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing), waiting up to ``timeout_s``."""
    fd = _open_lock_file(path)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"waited {timeout_s:.0f} s for the lock {path} (held by another process)"
                    ) from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def run_lock_path(store_root: str, run_id: str) -> Path:
    """``<root>/locks/<run_id>.lock`` for a local store. An S3 store has no shared file system:
    its lock lives on this machine (``~/.cache/evosteer/locks``), so it guards the trains
    started here only."""
    if store_root.startswith("s3://"):
        digest = hashlib.sha256(store_root.encode("utf-8")).hexdigest()[:16]
        return Path("~/.cache/evosteer/locks").expanduser() / f"{digest}-{run_id}.lock"
    root = Path(store_root.removeprefix("file://")).expanduser().resolve()
    return root / "locks" / f"{run_id}.lock"


def run_log_path(store_root: str, run_id: str, suffix: str = ".log") -> Path:
    """``<root>/logs/<run_id><suffix>`` for a local store; for an S3 store a file on this
    machine beside the run's lock (``~/.cache/evosteer/logs/``). The run's log is ``.log``, its
    managed model server's ``.serve.log``."""
    lock = run_lock_path(store_root, run_id)
    return lock.parent.parent / "logs" / lock.with_suffix(suffix).name


HOLDER_WAIT_S = 2.0
"""How long a refused train waits for the holder's line: the holder writes it just after it
takes the lock, so a train refused in between would otherwise name nobody."""


def _holder_line(fd: int) -> str:
    """The lock holder's "pid … on … since …" line ('' if it has not appeared in time)."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
        if holder or time.monotonic() > deadline:
            return holder
        time.sleep(0.02)


@contextlib.contextmanager
def run_lock(store_root: str, run_id: str) -> Iterator[Path]:
    """Hold the train lock of ``run_id`` in ``store_root``, or raise :class:`RunInUseError` at
    once naming the holder (pid, host, start time). A lock file that cannot be created (a
    read-only or full store root) is a :class:`StoreError`."""
    path = run_lock_path(store_root, run_id)
    try:
        fd = _open_lock_file(path)
    except OSError as exc:
        raise StoreError(store_root, f"create the run lock {path}", exc) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_line(fd)
            raise RunInUseError(
                f"run {run_id} in {store_root} is already being trained by "
                f"{holder or 'another process'}; wait for it to finish or train into another "
                "--run-dir"
            ) from None
        since = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}".encode(), 0)
        yield path
    finally:
        os.close(fd)
