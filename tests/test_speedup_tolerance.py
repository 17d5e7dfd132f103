"""A 3-step tiny-sim run of this code against the same run of the code before each saving that
moves floats (docs/performance.md, "Savings that change the last bits"), within stated
tolerances.

Before ``85193b9``'s successor, the re-score stage took ℓ and h_ρ of each sampled decision
from the pass that sampled it, and the sampler ran each group's prompt head once; after
``da2d2e9``, the last layer runs only at the positions read (``policy.read_positions``); after
``4ff7d21``, scoring groups prompts with a price per pass and splits a group into
length-sorted batches (``policy.batch``). Each is the same parameters, prompts, tokens and
masks in batches of other shapes or at fewer positions, so floats move by float32 rounding
and nothing else. What must
stay *exactly* equal: every trajectory (reward, actions, tokens, health), every decision's
action and forced flag. What may move, and by how much (``TOLERANCE``): ℓ (recorded, θ, ρ),
h_ρ, the update's metrics and the trained tensors after three steps.

Each file of ``BASELINES`` in ``tests/data/`` holds the run of the code before (its
revision), written by this module's ``--write`` mode, which runs the dump under that revision
(a temporary ``git worktree``) with this file's own summary code:

    .venv/bin/python tests/test_speedup_tolerance.py --write 85193b9 before_shared_passes_3step.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data"
BASELINES = {
    "before_shared_passes_3step.json": "85193b9",
    "before_read_positions_3step.json": "da2d2e9",
    "before_pass_price_3step.json": "4ff7d21",
}
"""Dump file → the revision it was written from."""
STEPS = 3
TOLERANCE = {
    "logp": 1e-5,
    "h_rho": 1e-4,
    "metrics": 1e-4,
    "tensors": 1e-4,
}
"""Largest absolute difference allowed: ℓ in nats; h_ρ per row's sum and norm (d_h = 128
entries of unit RMS); the update's metrics (relative to max(1, |value|)); each trained tensor's
sum and norm after the third step (relative to max(1, |value|))."""


def summarize(root: Path) -> dict:
    """The comparable content of a STEPS-step in-process run of ``pipeline_support``'s small
    tiny-sim config: exact columns as lists, floats as lists, tensors as (sum, norm)."""
    import torch

    from evosteer_core.infra.artifacts import LocalStore
    from evosteer_core.pipeline import stage_io

    sys.path.insert(0, str(Path(__file__).parent))
    from pipeline_support import small_config

    cfg = small_config(root)
    io_ = stage_io.StepStore(LocalStore(root))
    state = stage_io.init_artifacts(cfg, io_)
    out: dict = {}
    for step in range(1, STEPS + 1):
        refs = stage_io.run_step(cfg, io_, state, step)
        traj = io_.get_table(refs["trajectories"])
        dec = io_.get_table(refs["decisions"])
        res = io_.get_table(refs["rescored"])
        update = io_.get_object(refs["update"])
        h = np.array(res["h_rho"].tolist(), dtype=np.float64)
        out[str(step)] = {
            "trajectories": traj[
                ["traj_id", "reward", "n_actions", "tokens", "healthy", "complete"]
            ].values.tolist(),
            "decisions": dec[["traj_id", "t", "action", "forced"]].values.tolist(),
            "logp_sample": dec["logp_sample"].tolist(),
            "logp_theta": res["logp_theta"].tolist(),
            "logp_rho": res["logp_rho"].tolist(),
            "h_rho": [h.sum(axis=1).tolist(), np.linalg.norm(h, axis=1).tolist()],
            "metrics": {k: float(v) for k, v in sorted(update["metrics"].items())},
        }
        state = refs["state"]
    final = io_.get_state(state)
    tensors = {
        f"{part}/{name}": [float(t.double().sum()), float(t.double().norm())]
        for part in ("adapter", "value_head", "flow_head", "outcome_heads")
        for name, t in sorted(getattr(final, part).items())
        if isinstance(t, torch.Tensor)
    }
    out["tensors"] = tensors
    return out


def _close(got: list[float], want: list[float], tol: float, relative: bool = False) -> float:
    """Largest (relative) difference, asserting the lengths match; NaN must meet NaN (a metric
    that is undefined for a step, e.g. a loss term with no rows, stays undefined)."""
    assert len(got) == len(want)
    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert (np.isnan(a) == np.isnan(b)).all(), "a value became or stopped being NaN"
    a, b = np.nan_to_num(a), np.nan_to_num(b)
    scale = np.maximum(1.0, np.abs(b)) if relative else 1.0
    worst = float(np.max(np.abs(a - b) / scale)) if len(a) else 0.0
    assert worst <= tol, f"difference {worst:.3g} above the tolerance {tol:g}"
    return worst


@pytest.fixture(scope="module")
def now(tmp_path_factory) -> dict:
    return summarize(tmp_path_factory.mktemp("tolerance") / "runs")


@pytest.mark.parametrize("baseline", sorted(BASELINES))
def test_a_three_step_run_matches_the_code_before_within_tolerance(now, baseline):
    before = json.loads((DATA / baseline).read_text())
    for step in map(str, range(1, STEPS + 1)):
        got, want = now[step], before[step]
        assert got["trajectories"] == want["trajectories"], f"step {step}: trajectories differ"
        assert got["decisions"] == want["decisions"], f"step {step}: decisions differ"
        for column in ("logp_sample", "logp_theta", "logp_rho"):
            _close(got[column], want[column], TOLERANCE["logp"])
        for k in range(2):
            _close(got["h_rho"][k], want["h_rho"][k], TOLERANCE["h_rho"])
        assert sorted(got["metrics"]) == sorted(want["metrics"])
        names = sorted(want["metrics"])
        _close(
            [got["metrics"][n] for n in names],
            [want["metrics"][n] for n in names],
            TOLERANCE["metrics"],
            relative=True,
        )
    assert sorted(now["tensors"]) == sorted(before["tensors"])
    for name, want in before["tensors"].items():
        _close(now["tensors"][name], want, TOLERANCE["tensors"], relative=True)


def _write(rev: str, name: str) -> None:
    """Dump the run of revision ``rev`` (a temporary worktree) into ``DATA / name``."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            subprocess.run(
                [sys.executable, __file__, "--dump", str(DATA / name)],
                check=True,
                env=env,
                cwd=tree,
            )
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                           check=True, capture_output=True)
    print(f"wrote {DATA / name} from {rev}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--write":
        _write(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "--dump":
        with tempfile.TemporaryDirectory() as tmp:
            summary = summarize(Path(tmp) / "runs")
        Path(sys.argv[2]).write_text(json.dumps(summary) + "\n")
    else:
        sys.exit("usage: test_speedup_tolerance.py --write REV FILE")
