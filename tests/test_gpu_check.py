"""scripts/gpu_check.py, the one script a lent GPU runs (issue 15): its step section counts
the tokens the backbone embeds and times the step, and ``--only`` names sections strictly.
Run here on the CPU at a small shape; the GPU figures themselves come from a lent machine."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_section_counts_every_embedded_token(gpu_check, monkeypatch):
    """The count equals the tokens of every embedding call, counted here by wrapping
    ``nn.Embedding.forward`` itself (the script counts with a forward hook on the backbone's
    input embeddings only, so the LoRA-free value heads etc. must not add to it)."""
    seen: list[int] = []
    plain = torch.nn.Embedding.forward

    def counting(self, ids):
        seen.append(ids.numel())
        return plain(self, ids)

    monkeypatch.setattr(torch.nn.Embedding, "forward", counting)
    r = gpu_check.step_section("cpu", steps=1, batch=2, rollouts=1, runs=1)
    assert r["records"] == 2 and r["rollouts_theta_rho"] == [1, 1] and r["steps"] == 1
    assert r["backbone_tokens_per_run"] == [sum(seen)] and sum(seen) > 0
    assert r["seconds_per_step"] == r["seconds_per_run"]
    (rate,) = r["backbone_tokens_per_s"]
    assert rate == pytest.approx(sum(seen) / r["seconds_per_run"][0])


def test_only_rejects_an_unknown_section(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path), "--only", "nope"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "--only: no section nope" in done.stderr and "train_step_paper_batch" in done.stderr
    assert not (tmp_path / "gpu_check.json").exists()
