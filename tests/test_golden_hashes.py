"""Behaviour is pinned: the artifacts of a two-step tiny-sim run hash to recorded values.

The hashes in ``tests/data/golden_tiny_sim.json`` were written by this module's ``--write``
mode on the pinned stack (constraints.txt, the CPU torch wheel). A refactoring must leave every
one of them unchanged; a change that is *meant* to alter numbers rewrites the file in the same
commit and bumps ``CODE_VERSION``, and says why in its message:

    .venv/bin/python tests/test_golden_hashes.py --write

The float artifacts (decisions, rescored, value, update, state) also depend on the machine
(MKL and oneDNN choose their kernels by CPU vendor and instruction set; the trajectories, discrete
actions and rewards, do not), so the file holds one set of hashes per machine
(``tests/machine_pins.py``); ``--write`` records this machine's set and keeps the others. A
change meant to alter numbers rewrites every machine's set it can and drops the rest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "data" / "golden_tiny_sim.json"
STEPS = 2
WRITE = ".venv/bin/python tests/test_golden_hashes.py --write"


def golden() -> dict[str, dict[str, str]]:
    """This machine's recorded hashes (the test fails on a machine with none)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from machine_pins import pinned

    return pinned(json.loads(GOLDEN.read_text()), "golden hashes of a tiny-sim run", WRITE)


def run_hashes(root: Path) -> dict[str, dict[str, str]]:
    """sha256 of every artifact of a STEPS-step in-process run, per step ("0": the init state)."""
    from evosteer_core.infra.artifacts import LocalStore
    from evosteer_core.pipeline import stage_io

    sys.path.insert(0, str(Path(__file__).parent))
    from pipeline_support import small_config

    cfg = small_config(root)
    io_ = stage_io.StepStore(LocalStore(root))
    state = stage_io.init_artifacts(cfg, io_)
    out = {"0": {"state": state.sha256}}
    for step in range(1, STEPS + 1):
        refs = stage_io.run_step(cfg, io_, state, step)
        out[str(step)] = {name: ref.sha256 for name, ref in refs.items()}
        state = refs["state"]
    return out


DISCRETE = ("trajectories", "skills")
"""Artifacts with no float of the policy in them: the same bytes on every machine."""


@pytest.fixture(scope="module")
def hashes(tmp_path_factory) -> dict[str, dict[str, str]]:
    """The in-process run, after a ``torch.set_num_threads`` call (which turns MKL's dynamic
    threading off) as a CLI, a worker or an earlier test may make one."""
    torch.set_num_threads(torch.get_num_threads())
    return run_hashes(tmp_path_factory.mktemp("golden") / "runs")


def test_a_fresh_process_writes_the_bytes_of_this_one(hashes):
    """No caller's thread setting reaches the bytes (``infra.seeding.settle_threads``): a
    process that never set the count writes the same artifacts (on Intel it did not, before)."""
    out = subprocess.run(
        [sys.executable, __file__, "--print"], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == hashes


def test_the_discrete_artifacts_hash_as_on_every_recorded_machine(hashes):
    """Runs on any machine, recorded or not (the init state is a seeded init: also equal)."""
    for machine, recorded in json.loads(GOLDEN.read_text()).items():
        assert hashes["0"] == recorded["0"], machine
        for step in range(1, STEPS + 1):
            for name in DISCRETE:
                assert hashes[str(step)][name] == recorded[str(step)][name], (machine, step, name)


def test_a_tiny_sim_run_hashes_to_the_recorded_artifacts(hashes):
    assert hashes == golden()


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] == ["--print"]:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_hashes(Path(tmp) / "runs")))
        sys.exit(0)
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: test_golden_hashes.py --write | --print")
    sys.path.insert(0, str(Path(__file__).parent))
    from machine_pins import machine_key

    table = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        table[machine_key()] = run_hashes(Path(tmp) / "runs")
    GOLDEN.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} for {machine_key()}")
