"""Python sandbox: run untrusted model-written code in a contained subprocess (docs/method.md §1.3).

Mechanism (details, the escape table and the limits in docs/executors.md):

- a trusted launcher (``sandbox_launcher.py``) puts the run into new mount, PID, network,
  IPC and UTS namespaces (and a user namespace when the caller is not root); the run's init (PID 1 there) builds a read-only root
  holding only the interpreter, its standard library and shared libraries, ``/dev/null`` and
  friends, and the run's private, writable ``/tmp`` (a fresh folder, removed afterwards);
- every process of the run has a per-run uid (as root; else the caller's uid mapped in the
  user namespace, without capabilities), no supplementary groups, ``no_new_privs`` and
  resource limits: ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``;
- a wall-clock timeout; when the run's main process ends (or the wall time is up) init
  exits, and the kernel kills every process left in the PID namespace before we return;
- code rewards (``run_tests``) run the program and the hidden tests in two processes
  (``sandbox_harness.py``; different uids as root, a non-dumpable tests process otherwise):
  the tests prove they finished by writing a per-run
  random sentinel that the program never sees.

Where the host refuses the namespaces (``unshare`` fails) nothing runs unless
the caller accepted a weaker sandbox (``configure(allow_weak_sandbox=True)``, config key
``executor.sandbox.allow_weak_sandbox``); each result says which protections were in force.
"""

from __future__ import annotations

import errno
import importlib.util
import io
import json
import logging
import marshal
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

UID_BASE = 1_500_000_000
"""Per-run uids are drawn from ``[UID_BASE, UID_BASE + UID_SPAN)``, a range no host user has."""
UID_SPAN = 1 << 20

_LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
_HARNESS = Path(__file__).with_name("sandbox_harness.py")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_MASKED = ("site-packages", "dist-packages")
_TESTS_PROCESS_NPROC = 4
_BACKSTOP_S = 30.0
_SITE = "{site}"  # replaced in a process's arguments by the interpreter's site folder
_SHARED_UID = "{shared}"  # replaced by "1" where the program and the tests share one uid
_MISSING = b"missing module: "  # what the tests process reports when a tests' import fails
_DEFINES_CHECK = re.compile(r"^def\s+check\s*\(", re.M)

_MEMORY_ERROR = re.compile(r"^(MemoryError|numpy\.core\._exceptions\._ArrayMemoryError)\b", re.M)
_FILE_SIZE_ERROR = re.compile(r"\[Errno 27\]|File too large")

DEFAULT_PACKAGES = ("numpy",)
"""Third-party packages the view shows by default: MBPP+'s hidden tests import numpy."""

_settings: dict[str, object] = {"allow_weak_sandbox": False, "packages": DEFAULT_PACKAGES}
_strict_failure: list[str] = []
_warned: set[str] = set()


class SandboxUnavailableError(RuntimeError):
    """The host cannot isolate untrusted code and no weaker sandbox was accepted."""


def configure(*, allow_weak_sandbox: bool, packages: tuple[str, ...] = DEFAULT_PACKAGES) -> None:
    """Process-wide policy (``executor.sandbox``): whether runs may go ahead without
    namespaces when the host cannot give them, and which installed packages (of this
    environment, read-only) the sandbox shows besides the standard library."""
    _package_sources(tuple(packages))
    _settings["allow_weak_sandbox"] = bool(allow_weak_sandbox)
    _settings["packages"] = tuple(packages)


@dataclass(frozen=True)
class SandboxResult:
    """One sandboxed run. ``stdout`` keeps the head, ``stderr`` the tail, each ≤ ``max_chars``.

    ``killed_reason`` names the limit that stopped the program (``cpu``, ``wall``, ``memory``,
    ``file_size``) or is None. The four booleans say which protections were in force:
    ``filesystem_isolated`` (private read-only view), ``processes_contained`` (every process
    of the run killed at its end), ``network_isolated``, ``privileges_dropped`` (a per-run
    uid as root, a mapped uid without capabilities otherwise). ``tests_passed`` is set by
    ``run_tests`` only: the tests process wrote this run's sentinel after every test ran and
    passed.
    """

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    killed_reason: str | None
    network_isolated: bool
    privileges_dropped: bool
    filesystem_isolated: bool
    processes_contained: bool
    wall_s: float
    tests_passed: bool | None = None

    @property
    def ok(self) -> bool:
        """The program ran to completion, exited 0 and (for tests) every test passed."""
        ran = self.returncode == 0 and not self.timed_out and self.killed_reason is None
        return ran and self.tests_passed is not False

    @property
    def weak(self) -> bool:
        """Some protection of the full sandbox was not in force for this run."""
        return not (
            self.filesystem_isolated
            and self.processes_contained
            and self.network_isolated
            and self.privileges_dropped
        )


@dataclass(frozen=True)
class SandboxLimits:
    """The sandbox settings an executor passes to every run (docs/method.md §1.3 reference values)."""

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


def weak_interpreter(drop_privileges: bool) -> str:
    """The Python of a weak-sandbox run: this one, or (when dropping to a per-run uid and this
    one sits in a folder other users cannot enter) the first world-executable ``python3``."""
    own = Path(sys.executable)
    if not drop_privileges or _others_can_execute(own):
        return str(own)
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"):
        found = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
        if found and _others_can_execute(Path(found)):
            return found
    raise RuntimeError(
        f"sandbox: {own} is not executable by other users and no world-executable "
        "python3 was found in /usr/local/bin, /usr/bin or /bin; pass interpreter=..."
    )


@dataclass(frozen=True)
class _View:
    """What the sandbox's root shows of the host: ``binds`` (source, path, is_dir), all
    read-only, the package folders inside them hidden under empty ``masks``, and the shown
    ``packages`` (source, name, is_dir) in the interpreter's ``site_dir``."""

    python: str
    binds: tuple[tuple[str, str, bool], ...]
    masks: tuple[str, ...]
    site_dir: str
    packages: tuple[tuple[str, str, bool], ...]


_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


@lru_cache(maxsize=16)
def _package_sources(packages: tuple[str, ...]) -> tuple[tuple[str, str, bool], ...]:
    """Where each package of ``packages`` is installed here: (source, name in site, is_dir),
    with its auditwheel ``<name>.libs`` folder of bundled shared libraries when present."""
    sources = []
    for name in packages:
        spec = importlib.util.find_spec(name) if name.isidentifier() else None
        if spec is None or spec.origin in (None, "built-in", "frozen"):
            raise ValueError(
                f"executor.sandbox.packages: {name!r} is not an installed package of {sys.prefix}"
            )
        if spec.submodule_search_locations:
            source = os.path.realpath(next(iter(spec.submodule_search_locations)))
            sources.append((source, name, True))
        else:
            source = os.path.realpath(spec.origin)
            sources.append((source, os.path.basename(source), False))
        libs = os.path.join(os.path.dirname(source), f"{name}.libs")
        if os.path.isdir(libs):
            sources.append((libs, f"{name}.libs", True))
    return tuple(sources)


@lru_cache(maxsize=8)
def _python_view(interpreter: str, packages: tuple[str, ...]) -> _View:
    """The minimal filesystem view that runs ``interpreter``: its binary, the folders of its
    ``sys.path`` without site (standard library, ``lib-dynload``), ``packages`` in its site
    folder, and every shared library the binary and the extension modules load (from
    ``ldd``). Computed once per process."""
    python = os.path.realpath(interpreter)
    probe = "import site, sys; print(site.getsitepackages()[0]); print(*sys.path, sep='\\n')"
    site_dir, *found = subprocess.run(
        [python, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    folders: list[str] = []
    for entry in sorted({os.path.realpath(p) for p in found if p and os.path.isdir(p)}):
        if not any(entry.startswith(f + "/") for f in folders):
            folders.append(entry)
    shown = _package_sources(packages)
    scanned = folders + [source for source, _, is_dir in shown if is_dir]
    binaries = [python] + [source for source, _, is_dir in shown if not is_dir]
    for folder in scanned:
        for top, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in _MASKED)
            binaries += [os.path.join(top, n) for n in sorted(names) if ".so" in n]
    ldd = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
    libraries = {m.group(1) for m in _LDD_PATH.finditer(ldd)} - set(binaries)
    inside = [lib for lib in libraries if any(lib.startswith(f + "/") for f in scanned)]
    files = {python, *(libraries - set(inside))}
    if os.path.exists("/etc/ld.so.cache"):
        files.add("/etc/ld.so.cache")
    binds = [(f, f, True) for f in folders]
    binds += [(os.path.realpath(f), f, False) for f in sorted(files) if os.path.exists(f)]
    masks = tuple(
        os.path.join(folder, name)
        for folder in folders
        for name in _MASKED
        if os.path.isdir(os.path.join(folder, name))
        and not (shown and os.path.join(folder, name) == site_dir)
    )
    return _View(python, tuple(binds), masks, site_dir, shown)


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


@dataclass(frozen=True)
class _Proc:
    """One process of a run: its role, its arguments after the interpreter, the fds it gets
    (``(fd, name)``: name of an fd the parent opened) and whether it runs as the tests uid."""

    role: str
    args: tuple[str, ...]
    fds: tuple[tuple[int, str], ...]
    tests_uid: bool = False


@dataclass(frozen=True)
class _Limits:
    cpu_s: float
    wall_s: float
    memory_mb: int
    file_mb: int
    max_processes: int
    max_chars: int

    def __post_init__(self) -> None:
        if min(self.cpu_s, self.wall_s, self.memory_mb, self.file_mb, self.max_chars) <= 0:
            raise ValueError(
                "sandbox limits must be > 0: "
                f"cpu_s={self.cpu_s}, wall_s={self.wall_s}, memory_mb={self.memory_mb}, "
                f"file_mb={self.file_mb}, max_chars={self.max_chars}"
            )
        if self.max_processes < 1:
            raise ValueError(f"sandbox: max_processes must be >= 1, got {self.max_processes}")


def _host_cannot_isolate() -> str | None:
    """Why this host cannot give the full sandbox (a failed ``unshare`` of this process), or
    None when it can as far as known."""
    return _strict_failure[0] if _strict_failure else None


def _mode(allow_weak: bool | None) -> str:
    """``strict``, or ``weak`` when the host cannot isolate and the caller accepted it."""
    reason = _host_cannot_isolate()
    if reason is None:
        return "strict"
    accepted = _settings["allow_weak_sandbox"] if allow_weak is None else allow_weak
    if not accepted:
        raise SandboxUnavailableError(
            f"sandbox: {reason}; refusing to run untrusted code without namespaces. Set "
            "executor.sandbox.allow_weak_sandbox: true to accept a weaker sandbox "
            "(docs/executors.md, 'Python sandbox')"
        )
    if reason not in _warned:
        _warned.add(reason)
        log.warning(
            "WEAK SANDBOX: %s. Untrusted code now runs without a private filesystem view or "
            "PID namespace: it can read every file the run's uid can read (benchmark data, "
            "gold answers) and code rewards can be gamed (docs/executors.md).",
            reason,
        )
    return "weak"


def _read(path: Path, limit_bytes: int, tail: bool) -> str:
    size = path.stat().st_size
    with path.open("rb") as f:
        if tail and size > limit_bytes:
            f.seek(size - limit_bytes)
        data = f.read(limit_bytes)
    return data.decode("utf-8", errors="replace")


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _launch(
    procs: tuple[_Proc, ...],
    limits: _Limits,
    *,
    stdin: str,
    work_files: dict[str, str],
    fd_files: dict[str, bytes],
    pipes: tuple[str, ...],
    interpreter: str | None,
    allow_weak: bool | None,
) -> tuple[SandboxResult, bytes, dict[str, int]]:
    """Run ``procs`` in a fresh sandbox; the main process is the first. Returns the result,
    what arrived on the ``result`` pipe (when one of ``pipes``) and every process's status."""
    mode = _mode(allow_weak)
    drop = os.geteuid() == 0
    if mode == "strict":
        base = interpreter or getattr(sys, "_base_executable", sys.executable)
        view = _python_view(base, _settings["packages"])  # type: ignore[arg-type]
        python, cwd, home, site_dir = view.python, "/tmp", "/tmp", view.site_dir
    else:
        view, python = None, interpreter or weak_interpreter(drop)
        own = python == sys.executable
        site_dir = sysconfig.get_path("purelib") if own else ""
    run_dir = Path(tempfile.mkdtemp(prefix="evosteer-sbx-"))
    opened: dict[str, int] = {}
    readers: dict[str, int] = {}
    try:
        work, root = run_dir / "work", run_dir / "root"
        work.mkdir(mode=0o700)
        root.mkdir()
        if mode == "weak":
            cwd = home = str(work)
            run_dir.chmod(0o711)  # the run's uid must reach its work folder on the host
        base = UID_BASE + 2 * secrets.randbelow(UID_SPAN // 2)  # (tests uid: base + 1)
        for name, text in work_files.items():
            (work / name).write_text(text)
            if drop:
                os.chown(work / name, base, base)
        if drop:
            os.chown(work, base, base)
        (run_dir / "stdin").write_text(stdin)
        opened["stdin"] = os.open(run_dir / "stdin", os.O_RDONLY)
        for name in ("stdout", "stderr"):
            opened[name] = os.open(run_dir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for name, data in fd_files.items():
            path = run_dir / name
            path.write_bytes(data)
            opened[name] = os.open(path, os.O_RDONLY)
            path.unlink()
        for name in ("report", *pipes):
            r, w = os.pipe()
            if name in ("report", "result"):
                readers[name], opened[name] = r, w
            else:
                opened[name + "_r"], opened[name + "_w"] = r, w
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
        fill = {_SITE: site_dir, _SHARED_UID: "" if drop else "1"}
        config = {
            "mode": mode,
            "drop": drop,
            "userns": mode == "strict" and not drop,
            "root_dir": str(root),
            "work_dir": str(work),
            "binds": view.binds if view else [],
            "masks": view.masks if view else [],
            "site": {"path": view.site_dir, "packages": view.packages}
            if view and view.packages
            else None,
            "devices": [d for d in _DEVICES if os.path.exists(d)],
            "wall_s": limits.wall_s,
            "limits": {
                "cpu": max(1, int(limits.cpu_s + 0.999)),
                "memory_mb": limits.memory_mb,
                "file_mb": limits.file_mb,
            },
            "fds": opened,
            "main": procs[0].role,
            "procs": [
                {
                    "role": p.role,
                    "uid": base + (p.tests_uid and drop),
                    "nproc": _TESTS_PROCESS_NPROC if p.tests_uid else limits.max_processes,
                    "argv": [python, *(fill.get(a, a) for a in p.args)],
                    "cwd": "/" if p.tests_uid and mode == "strict" else cwd,
                    "env": env,
                    "fds": p.fds,
                }
                for p in procs
            ],
        }
        (run_dir / "launch.cfg").write_bytes(marshal.dumps(config))
        with (run_dir / "launcher.log").open("wb") as launcher_log:
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_LAUNCHER), str(run_dir / "launch.cfg")],
                stdin=subprocess.DEVNULL,
                stdout=launcher_log,
                stderr=launcher_log,
                pass_fds=tuple(opened.values()),
                start_new_session=True,
            )
        for fd in opened.values():
            os.close(fd)
        opened.clear()
        backstop = not _exited_within(proc, limits.wall_s + _BACKSTOP_S)
        _kill_group(proc.pid)
        proc.wait()
        elapsed = time.monotonic() - start
        report: dict = {}
        records = io.BytesIO(_drain(readers["report"]))
        while records.tell() < len(records.getbuffer()):
            report.update(marshal.load(records))
        result = _drain(readers["result"]) if "result" in readers else b""
        if report.get("unshare_failed"):
            _strict_failure.append(f"the host refused namespaces ({report['error']})")
        elif "error" in report or "statuses" not in report and not report.get("stopped"):
            log_text = (run_dir / "launcher.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"sandbox setup failed: {report.get('error')}\n{log_text}")
        else:
            stdout = _read(run_dir / "stdout", 4 * limits.max_chars + 64, tail=False)
            stderr = _read(run_dir / "stderr", 4 * limits.max_chars + 64, tail=True)
    finally:
        for fd in (*opened.values(), *readers.values()):
            os.close(fd)
        shutil.rmtree(run_dir, ignore_errors=True)
    if report.get("unshare_failed"):
        return _launch(
            procs,
            limits,
            stdin=stdin,
            work_files=work_files,
            fd_files=fd_files,
            pipes=pipes,
            interpreter=interpreter,
            allow_weak=allow_weak,
        )
    statuses = report.get("statuses", {})
    wall_killed = backstop or report.get("stopped") is not None
    status = statuses.get(procs[0].role)
    returncode = (
        -signal.SIGKILL if wall_killed or status is None else os.waitstatus_to_exitcode(status)
    )
    return (
        SandboxResult(
            stdout=_cap_head(stdout, limits.max_chars),
            stderr=_cap_tail(stderr, limits.max_chars),
            returncode=returncode,
            timed_out=wall_killed,
            killed_reason=_killed_reason(returncode, stderr, wall_killed),
            network_isolated=bool(report.get("network")),
            privileges_dropped=drop or mode == "strict",
            filesystem_isolated=mode == "strict",
            processes_contained=mode == "strict" or drop,
            wall_s=elapsed,
        ),
        result,
        statuses,
    )


def _exited_within(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for ``proc`` to exit, at most ``timeout_s``; woken by a pidfd the moment it does
    (``Popen.wait(timeout)`` polls with sleeps of up to 50 ms)."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        return bool(select.select([pidfd], [], [], timeout_s)[0])
    finally:
        os.close(pidfd)


def _kill_group(pgid: int) -> None:
    """SIGKILL whatever is left in the launcher's process group (a no-op once it is empty)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


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
    allow_weak: bool | None = None,
) -> SandboxResult:
    """Run ``code`` as ``/tmp/main.py`` (``python -I``, cwd ``/tmp``) in the sandbox.

    ``max_processes`` caps the processes of the run's uid (RLIMIT_NPROC). ``allow_weak``
    overrides the process-wide policy of ``configure``; without the full sandbox and without
    that acceptance this raises ``SandboxUnavailableError``.
    """
    limits = _Limits(cpu_s, wall_s, memory_mb, file_mb, max_processes, max_chars)
    main = _Proc("main", ("-I", "main.py"), ((0, "stdin"), (1, "stdout"), (2, "stderr")))
    result, _, _ = _launch(
        (main,),
        limits,
        stdin=stdin,
        work_files={"main.py": code},
        fd_files={},
        pipes=(),
        interpreter=interpreter,
        allow_weak=allow_weak,
    )
    return result


def run_tests(program: str, tests: str, entry_point: str, **limits: object) -> SandboxResult:
    """Run hidden tests against ``program``; ``result.tests_passed`` (and ``ok``) is True iff
    every test ran and passed.

    HumanEval style (``tests`` defines ``check``): ``check(entry_point)``; otherwise the tests
    are a script (MBPP+: top-level asserts) calling the program's functions by name. The
    program is imported as the module ``solution`` in its own process; the tests run in a
    second process under another uid and reach the program's functions through proxies
    whose results arrive as plain built-in values (``sandbox_harness.py``). The tests
    process writes a fresh random sentinel to a pipe only the parent reads, after the last
    test; any early exit, signal or exception anywhere before that is a failure.
    """
    if not entry_point.isidentifier():
        raise ValueError(f"run_tests: entry_point must be an identifier, got {entry_point!r}")
    allow_weak = limits.pop("allow_weak", None)
    interpreter = limits.pop("interpreter", None)
    checked = _DEFINES_CHECK.search(tests) is not None
    sentinel = secrets.token_hex(32)
    payload = {"sentinel": sentinel, "tests": tests, "entry_point": entry_point, "check": checked}
    harness = _HARNESS.read_text()
    std = ((1, "stdout"), (2, "stderr"))
    tests_proc = _Proc(
        "tests",
        ("-I", "-S", "-c", harness, "tests", _SITE, _SHARED_UID, "3", "4", "5", "6"),
        ((0, "devnull"), *std, (3, "payload"), (4, "reply_r"), (5, "call_w"), (6, "result")),
        tests_uid=True,
    )
    program_proc = _Proc(
        "program",
        ("-I", "-S", "-c", harness, "program", _SITE, _SHARED_UID, "3", "4", "5"),
        ((0, "stdin"), *std, (3, "source"), (4, "call_r"), (5, "reply_w")),
    )
    result, written, statuses = _launch(
        (tests_proc, program_proc),
        _Limits(**{**SandboxLimits().as_kwargs(), **limits}),  # type: ignore[arg-type]
        stdin="",
        work_files={},
        fd_files={"payload": json.dumps(payload).encode(), "source": program.encode()},
        pipes=("result", "call", "reply"),
        interpreter=interpreter,  # type: ignore[arg-type]
        allow_weak=allow_weak,  # type: ignore[arg-type]
    )
    if written.startswith(_MISSING):
        name = written[len(_MISSING) :].decode(errors="replace")
        raise RuntimeError(
            f"sandbox: the hidden tests import {name!r}, which the sandbox does not show; add "
            "it to executor.sandbox.packages (docs/executors.md, 'Python sandbox')"
        )
    passed = result.returncode == 0 and written == sentinel.encode()
    reason = result.killed_reason
    if reason is None and not passed and "program" in statuses:
        reason = _killed_reason(os.waitstatus_to_exitcode(statuses["program"]), "", False)
    return replace(result, tests_passed=passed, killed_reason=reason)
