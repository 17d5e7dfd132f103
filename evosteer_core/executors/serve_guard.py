"""Keeps a managed model server from outliving the process that started it.

Run as ``python -I -S serve_guard.py COMMAND...`` (standard library only) with a pipe on
standard input whose write end only the starting process holds. The guard starts COMMAND in a
new session and waits; when the pipe reaches end of file (the starter closed it, exited or was
killed, even by SIGKILL) or the guard gets SIGTERM, it stops the server's whole process group:
SIGTERM, then SIGKILL after :data:`GRACE_S` (``transformers serve`` does not end on SIGTERM
while a request is running). When the server exits by itself the guard exits with its status.
Terminal signals (Ctrl-C) are ignored here: they reach the starter, whose exit ends the pipe.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

GRACE_S = 5.0
_POLL_S = 0.5


def _stop(proc: subprocess.Popen) -> int:
    """End the server's process group: SIGTERM, then SIGKILL after the grace period."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def main(argv: list[str]) -> int:
    if not argv:
        print("serve_guard: no command given", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    while not stop:
        code = proc.poll()
        if code is not None:
            return code
        readable, _, _ = select.select([sys.stdin], [], [], _POLL_S)
        if readable and not os.read(sys.stdin.fileno(), 1):
            break  # end of file: the starter is gone or asked to stop
    _stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
