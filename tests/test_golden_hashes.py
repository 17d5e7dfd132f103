"""Behaviour is pinned: the artifacts of a two-step tiny-sim run hash to recorded values.

The hashes in ``tests/data/golden_tiny_sim.json`` were written by this module's ``--write``
mode on the pinned stack (constraints.txt, the CPU torch wheel). A refactoring must leave every
one of them unchanged; a change that is *meant* to alter numbers rewrites the file in the same
commit and bumps ``CODE_VERSION``, and says why in its message:

    .venv/bin/python tests/test_golden_hashes.py --write

The float artifacts (decisions, rescored, value, update, state) also depend on the machine:
MKL and oneDNN choose their kernels by CPU vendor and instruction set, and the last bits of a
float32 reduction follow. The file was rewritten on 2 Dec 2026 on the CI machine of that day
(:data:`RECORDED_ON`) with no code change: the machine before (another CPU) had written other
bytes for the same code, while the trajectories (discrete actions, rewards) were equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "golden_tiny_sim.json"
STEPS = 2
RECORDED_ON = "AMD EPYC (AVX-512), 2 cores, torch 2.13.0+cpu (MKL 2024.2, oneDNN 3.12), 2 threads"
"""The machine the golden hashes were written on (a failure elsewhere may be the machine)."""


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


def test_a_tiny_sim_run_hashes_to_the_recorded_artifacts(tmp_path):
    expected = json.loads(GOLDEN.read_text())
    assert run_hashes(tmp_path / "runs") == expected, f"the golden hashes are of {RECORDED_ON}"


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: test_golden_hashes.py --write")
    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps(run_hashes(Path(tmp) / "runs"), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
