"""Python sandbox: run untrusted model-written code in a limited subprocess (SPEC §1.3).

Mechanism (details and limits in docs/executors.md):

- a fresh temporary working directory, removed afterwards; the program is ``main.py`` there,
  run with ``python -I`` (isolated mode: no user site, no ``PYTHON*`` variables) and a
  minimal environment;
- resource limits set in the child before ``exec``: ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL one
  second later), ``RLIMIT_AS`` (address space), ``RLIMIT_FSIZE`` (largest file written,
  stdout/stderr included) and, when privileges are dropped, ``RLIMIT_NPROC``;
- a wall-clock timeout that kills the whole process group (the child starts a new session);
- a new, empty network namespace (``unshare(CLONE_NEWNET)``) where the OS allows it; whether
  it was applied is reported per run;
- when the caller is root, the child drops to an unprivileged uid/gid (default 65534,
  ``nobody``) with no supplementary groups, so root-owned files of mode 0600 (gold answers)
  cannot be read.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

CLONE_NEWNET = 0x40000000
"""Linux ``sched.h`` flag for a new network namespace (``os.unshare`` exists only from 3.12)."""

UNPRIVILEGED_ID = 65534
"""uid/gid of ``nobody``: what the child runs as when the caller is root."""

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

_MEMORY_ERROR = re.compile(r"^(MemoryError|numpy\.core\._exceptions\._ArrayMemoryError)\b", re.M)
_FILE_SIZE_ERROR = re.compile(r"\[Errno 27\]|File too large")


@dataclass(frozen=True)
class SandboxResult:
    """One sandboxed run. ``stdout`` keeps the head, ``stderr`` the tail, each ≤ ``max_chars``.

    ``killed_reason`` names the limit that stopped the program (``cpu``, ``wall``, ``memory``,
    ``file_size``) or is None. ``network_isolated`` and ``privileges_dropped`` say which of the
    OS-dependent protections were in force.
    """

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    killed_reason: str | None
    network_isolated: bool
    privileges_dropped: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        """The program ran to completion and exited 0."""
        return self.returncode == 0 and not self.timed_out and self.killed_reason is None


@dataclass(frozen=True)
class SandboxLimits:
    """The sandbox settings an executor passes to every run (SPEC §1.3 reference values)."""

    cpu_s: float = 10
    wall_s: float = 15
    memory_mb: int = 4096
    file_mb: int = 16
    max_processes: int = 64
    max_chars: int = 2000

    def as_kwargs(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def format_run(result: SandboxResult, max_chars: int = 2000) -> str:
    """The python tool's result text for the model: output, errors and why it stopped."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.stderr.strip():
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if result.killed_reason:
        parts.append(f"stopped: {result.killed_reason} limit exceeded")
    parts.append(f"exit code {result.returncode}")
    text = "\n".join(parts)
    return text if len(text) <= max_chars else _cap_tail(text, max_chars - 40)


def _cap_head(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n…[{len(text) - max_chars} more chars]"


def _cap_tail(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return f"…[{len(text) - max_chars} chars before]\n" + text[-max_chars:]


def _others_can_execute(path: Path) -> bool:
    """Whether a user who is neither owner nor group member can run ``path`` (after symlinks)."""
    real = path.resolve()
    try:
        if not real.stat().st_mode & stat.S_IXOTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)
    except OSError:
        return False


def default_interpreter(drop_privileges: bool) -> str:
    """The Python the child runs: this interpreter, or (when dropping to ``nobody`` and this
    one sits in a directory ``nobody`` cannot enter) the first world-executable ``python3``."""
    own = Path(sys.executable)
    if not drop_privileges or _others_can_execute(own):
        return str(own)
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"):
        found = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
        if found and _others_can_execute(Path(found)):
            return found
    raise RuntimeError(
        f"sandbox: {own} is not executable by uid {UNPRIVILEGED_ID} and no world-executable "
        "python3 was found in /usr/local/bin, /usr/bin or /bin; pass interpreter=..."
    )


def _make_preexec(
    cpu_s: float, memory_mb: int, file_mb: int, max_processes: int, drop: bool, report_fd: int
) -> Callable[[], None]:
    """The function the child runs between fork and exec (only async-signal-tolerant calls)."""
    cpu = max(1, int(cpu_s + 0.999))

    def preexec() -> None:
        isolated = b"0"
        if _LIBC is not None and _LIBC.unshare(CLONE_NEWNET) == 0:
            isolated = b"1"
        os.write(report_fd, isolated)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop:
            resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
            os.setgroups([])
            os.setgid(UNPRIVILEGED_ID)
            os.setuid(UNPRIVILEGED_ID)

    return preexec


def _killed_reason(returncode: int, stderr_tail: str, wall_killed: bool) -> str | None:
    if wall_killed:
        return "wall"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        # SIGKILL not sent by us: the kernel's hard RLIMIT_CPU (soft limit + 1 s).
        return "cpu"
    if returncode == -signal.SIGXFSZ:
        return "file_size"
    if returncode != 0:
        last = stderr_tail.strip().splitlines()[-1:] or [""]
        if _MEMORY_ERROR.search(last[0]):
            return "memory"
        if _FILE_SIZE_ERROR.search(last[0]):
            return "file_size"
    return None


def _read(path: Path, limit_bytes: int, tail: bool) -> str:
    size = path.stat().st_size
    with path.open("rb") as f:
        if tail and size > limit_bytes:
            f.seek(size - limit_bytes)
        data = f.read(limit_bytes)
    return data.decode("utf-8", errors="replace")


def run_python(
    code: str,
    *,
    stdin: str = "",
    cpu_s: float = 10,
    wall_s: float = 15,
    memory_mb: int = 4096,
    file_mb: int = 16,
    max_processes: int = 64,
    max_chars: int = 2000,
    interpreter: str | None = None,
    drop_privileges: bool | None = None,
) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox and return what happened.

    ``drop_privileges`` defaults to "when running as root". ``max_processes`` caps the
    processes of the unprivileged uid (RLIMIT_NPROC counts per uid, so it is shared by
    concurrent sandboxes and only applied when privileges are dropped).
    """
    if cpu_s <= 0 or wall_s <= 0 or memory_mb <= 0 or file_mb <= 0 or max_chars <= 0:
        raise ValueError(
            "sandbox limits must be > 0: "
            f"cpu_s={cpu_s}, wall_s={wall_s}, memory_mb={memory_mb}, file_mb={file_mb}, "
            f"max_chars={max_chars}"
        )
    drop = os.geteuid() == 0 if drop_privileges is None else drop_privileges
    if drop and os.geteuid() != 0:
        raise PermissionError("sandbox: drop_privileges=True needs root")
    python = interpreter or default_interpreter(drop)
    io_dir = Path(tempfile.mkdtemp(prefix="evosteer-sbx-io-"))
    work = Path(tempfile.mkdtemp(prefix="evosteer-sbx-"))
    report_r, report_w = os.pipe()
    try:
        (work / "main.py").write_text(code)
        (io_dir / "stdin").write_text(stdin)
        if drop:
            os.chown(work, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
            os.chown(work / "main.py", UNPRIVILEGED_ID, UNPRIVILEGED_ID)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8"}
        preexec = _make_preexec(cpu_s, memory_mb, file_mb, max_processes, drop, report_w)
        start = time.monotonic()
        with (
            (io_dir / "stdin").open("rb") as f_in,
            (io_dir / "stdout").open("wb") as f_out,
            (io_dir / "stderr").open("wb") as f_err,
        ):
            proc = subprocess.Popen(
                [python, "-I", "main.py"],
                stdin=f_in,
                stdout=f_out,
                stderr=f_err,
                cwd=work,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
                close_fds=True,
            )
        os.close(report_w)
        report_w = -1
        wall_killed = False
        try:
            proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:
            wall_killed = True
        _kill_group(proc.pid)
        proc.wait()
        elapsed = time.monotonic() - start
        isolated = os.read(report_r, 1) == b"1"
        stdout = _read(io_dir / "stdout", 4 * max_chars + 64, tail=False)
        stderr = _read(io_dir / "stderr", 4 * max_chars + 64, tail=True)
    finally:
        os.close(report_r)
        if report_w >= 0:
            os.close(report_w)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)
    return SandboxResult(
        stdout=_cap_head(stdout, max_chars),
        stderr=_cap_tail(stderr, max_chars),
        returncode=proc.returncode,
        timed_out=wall_killed,
        killed_reason=_killed_reason(proc.returncode, stderr, wall_killed),
        network_isolated=isolated,
        privileges_dropped=drop,
        wall_s=elapsed,
    )


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in the sandbox's process group (a no-op once it is empty)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def run_tests(program: str, tests: str, entry_point: str, **limits: object) -> SandboxResult:
    """Run a HumanEval-style test: ``program``, then ``tests`` (defining ``check``), then
    ``check(entry_point)``. The tests pass iff the run exits 0 (``result.ok``)."""
    if not entry_point.isidentifier():
        raise ValueError(f"run_tests: entry_point must be an identifier, got {entry_point!r}")
    code = f"{program}\n\n{tests}\n\ncheck({entry_point})\n"
    return run_python(code, **limits)  # type: ignore[arg-type]
