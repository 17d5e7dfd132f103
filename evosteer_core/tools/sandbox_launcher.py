"""The sandbox's trusted launcher: run as root by ``sandbox.run_python``/``run_tests`` with
``python -I -S sandbox_launcher.py CONFIG``. Standard library only (it runs before anything
else is set up); docs/executors.md ("Python sandbox") describes the mechanism.

Strict mode: ``unshare`` new mount, PID, network, IPC and UTS namespaces (and, for a caller
that is not root, a user namespace mapping its own uid), fork the run's init
(PID 1 of the new PID namespace), which builds a read-only root on a tmpfs (bind mounts of
the interpreter, its standard library and shared libraries, the configured packages in its
site folder, a few devices, and the run's private work folder as ``/tmp``), switches to it with ``pivot_root`` and forks the run's
processes under per-run uids. When init exits the kernel kills every process left in the
namespace, and the launcher's ``waitpid`` returns only after they are gone. Weak mode (the
caller explicitly accepted it) skips the namespaces: same limits and uids, and the processes
of the run's uids are killed by uid at the end.

The configuration and the report (on ``report_fd``) are ``marshal`` records: the launcher
imports as little as it can, since it starts once per run. It never runs untrusted code.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
_KEPT = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


class SetupError(Exception):
    """A namespace or mount step failed (the message names the step and the errno)."""


def _fs(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {err})")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None) -> None:
    rc = _libc.mount(_fs(src), _fs(dst), _fs(fstype), flags, _fs(data))
    _check(rc, f"mount {src or ''} on {dst}")


def _mountpoint(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, mode=0o755, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if not os.path.exists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _bind(src: str, dst: str, is_dir: bool, flags: int) -> None:
    """Bind ``src`` on ``dst`` and remount it with ``flags`` (read-only needs the remount),
    keeping the source mount's own restrictions (in a user namespace they are locked)."""
    _mountpoint(dst, is_dir)
    _mount(src, dst, None, MS_BIND | MS_REC, None)
    source = os.statvfs(src).f_flag
    kept = sum(ms for st, ms in _KEPT if source & st)
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | flags | kept, None)


def build_root(cfg: dict) -> str:
    """The run's filesystem view (inside the new mount namespace); returns how the root was
    switched (``pivot_root``, or ``chroot`` where the host's root cannot be pivoted)."""
    new_root = cfg["root_dir"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    ro = MS_RDONLY | MS_NOSUID | MS_NODEV
    for src, dst, is_dir in cfg["binds"]:
        _bind(src, new_root + dst, is_dir, ro)
    for dst in cfg["masks"]:
        _mount("tmpfs", new_root + dst, "tmpfs", ro, "size=4k,mode=0555")
    if cfg["site"]:
        site = new_root + cfg["site"]["path"]
        _mountpoint(site, True)
        _mount("tmpfs", site, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
        for src, name, is_dir in cfg["site"]["packages"]:
            _bind(src, f"{site}/{name}", is_dir, ro)
        _mount(None, site, None, MS_BIND | MS_REMOUNT | ro, None)
    for dev in cfg["devices"]:
        _bind(dev, new_root + dev, False, MS_NOSUID | MS_NOEXEC)
    _bind(cfg["work_dir"], new_root + "/tmp", True, MS_NOSUID | MS_NODEV)
    os.chdir(new_root)
    how = "chroot"
    if SYS_PIVOT_ROOT is not None and _libc.syscall(SYS_PIVOT_ROOT, b".", b".") == 0:
        _check(_libc.umount2(b".", MNT_DETACH), "umount the old root")
        how = "pivot_root"
    else:
        os.chroot(".")
    os.chdir("/")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | ro, None)
    return how


def _set_limits(limits: dict, nproc: int) -> None:
    cpu = limits["cpu"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = limits["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits["file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _exec(proc: dict, cfg: dict) -> None:
    """In a fresh child of init: arrange the fds, limits and uid of one process, then exec."""
    try:
        moved = [(target, os.dup(source)) for target, source in proc["fds"]]
        for target, copy in moved:
            os.dup2(copy, target)
        os.closerange(max(t for t, _ in moved) + 1, 1 << 16)
        os.chdir(proc["cwd"])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        _set_limits(cfg["limits"], proc["nproc"] if cfg["drop"] or cfg["userns"] else 0)
        if cfg["drop"]:
            os.setgroups([])
            os.setgid(proc["uid"])
            os.setuid(proc["uid"])
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.execve(proc["argv"][0], proc["argv"], proc["env"])
    except BaseException as exc:  # noqa: BLE001 - report any setup failure, never return
        os.write(2, f"sandbox: could not start {proc['role']}: {exc!r}\n".encode())
    os._exit(127)


def run_init(cfg: dict, report_fd: int) -> None:
    """The run's init: build the view (strict), start the processes, wait for the main one."""
    root = build_root(cfg) if cfg["mode"] == "strict" else None
    devnull = os.open("/dev/null", os.O_RDWR)
    fds = {"devnull": devnull, **{k: v for k, v in cfg["fds"].items()}}
    pids: dict[int, str] = {}
    for proc in cfg["procs"]:
        proc = {**proc, "fds": [(t, fds[name]) for t, name in proc["fds"]]}
        pid = os.fork()
        if pid == 0:
            _exec(proc, cfg)
        pids[pid] = proc["role"]
    for name, fd in fds.items():
        if name != "report":
            os.close(fd)
    statuses: dict[str, int] = {}
    while cfg["main"] not in statuses:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid in pids:
            statuses[pids[pid]] = status
    os.write(report_fd, marshal.dumps({"root": root, "statuses": statuses}))


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (from a child that becomes ``uid``: kill(-1) reaches
    exactly the processes that uid may signal), repeated until none is left."""
    for _ in range(20):
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
                os.kill(-1, 0)
            except ProcessLookupError:
                os._exit(0)
            except BaseException:  # noqa: BLE001
                os._exit(2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 0:
            return


def _map_ids(inner: int, uid: int, gid: int) -> None:
    """In a new user namespace: map the caller's uid and gid (the only ones an unprivileged
    caller may map) to ``inner``. The run's processes then exec as ``inner``, a non-zero
    uid, so they keep no capability; init keeps the namespace's until it exits."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{inner} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{inner} {gid} 1")


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        cfg = marshal.load(f)
    report_fd = cfg["fds"]["report"]

    def report(**fields: object) -> None:
        os.write(report_fd, marshal.dumps(fields))

    if cfg["mode"] == "strict":
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
        uid, gid = os.getuid(), os.getgid()
        try:
            _check(_libc.unshare(flags | (CLONE_NEWUSER if cfg["userns"] else 0)), "unshare")
            if cfg["userns"]:
                _map_ids(cfg["procs"][0]["uid"], uid, gid)
        except (SetupError, OSError) as exc:
            report(error=str(exc), unshare_failed=True)
            sys.exit(3)
        report(network=True, mounts=True, pids=True)
    else:
        report(network=_libc.unshare(CLONE_NEWNET) == 0, mounts=False, pids=False)
    init = os.fork()
    if init == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            run_init(cfg, report_fd)
        except BaseException as exc:  # noqa: BLE001 - the parent turns this into an error
            report(error=f"init: {exc}")
            os._exit(3)
        os._exit(0)
    for name, fd in cfg["fds"].items():
        if name != "report":
            os.close(fd)

    stopped = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append("wall" if signum == signal.SIGALRM else "terminated")
        os.kill(init, signal.SIGKILL)

    signal.signal(signal.SIGALRM, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.setitimer(signal.ITIMER_REAL, cfg["wall_s"])
    _, status = os.waitpid(init, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    if cfg["mode"] == "weak" and cfg["drop"]:
        for proc in cfg["procs"]:
            kill_uid(proc["uid"])
    report(stopped=stopped[0] if stopped else None, init_status=status)


if __name__ == "__main__":
    main()
    os._exit(0)  # nothing to flush or finalize: skip the interpreter's shutdown
