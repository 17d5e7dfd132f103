"""The core never loads Flyte (docs/architecture.md, the dependency rule): every module of
``evosteer_core`` imports in a fresh interpreter without ``flytekit``, and ``evosteer report``,
which only reads a run's recorded config and history, runs without it too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline_support import recorded_run

REPO = Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import importlib, pkgutil, sys
import evosteer_core
names = [m.name for m in pkgutil.walk_packages(evosteer_core.__path__, "evosteer_core.")]
for name in names:
    importlib.import_module(name)
assert len(names) > 50, names
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "flytekit")
print(len(names), "modules;", "flytekit loaded by", loaded[:3] if loaded else "nothing")
sys.exit(1 if loaded else 0)
"""

REPORT = """
import sys
from evosteer_flyte.cli import main
rc = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "flytekit")
print("flytekit loaded:", loaded[:3])
sys.exit(rc or (2 if loaded else 0))
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_every_core_module_imports_without_flytekit() -> None:
    done = _python(IMPORT_ALL)
    assert done.returncode == 0, done.stdout + done.stderr


def test_report_reads_a_recorded_run_without_flytekit(tmp_path: Path) -> None:
    _, run_id = recorded_run(tmp_path / "run")
    out = tmp_path / "report.html"
    args = ("report", "--run-dir", str(tmp_path / "run"), "--run", run_id, "--out", str(out))
    done = _python(REPORT, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"wrote {out} (2 steps)" in done.stdout
    page = out.read_text(encoding="utf-8")
    assert f"EvoSteer run {run_id} (SIMULATED executor)" in page
    assert page.count("data:image/svg+xml;base64,") == 4
