"""The learning scripts run end to end on a minimal SIMULATED setting and print their reports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import ttest_rel
from transformers import AutoModelForCausalLM

from evosteer_core.infra.config import LoraConfig, PolicyConfig
from evosteer_core.infra.model_cache import cache_root
from evosteer_core.policy.backbone import load_policy, tiny_model_folder
from evosteer_core.training.state import TrainState

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_learning_curve_prints_curve_tilt_and_saves_plot(tmp_path: Path) -> None:
    png, raw = tmp_path / "curve.png", tmp_path / "curve.json"
    out = _run(
        "experiments/learning_curve.py",
        *("--steps", "1", "--batch", "2", "--rollouts", "1", "--seeds", "5"),
        *("--eval-every", "1", "--eval-runs", "1", "--heldout", "1", "--threads", "2"),
        *("--png", str(png), "--json", str(raw), "--save-state", str(tmp_path)),
    )
    assert "seed 5 step   1  train θ" in out and "anchor-only" in out
    assert "seed 5 step   0  held-out (T=1)" in out and "tilt AUC 0.500 gap +0.000" in out
    assert "learned tilt on ρ's held-out trajectories" in out
    assert "reweighted gain +0.000 ± 0.000" in out  # step 0: θ = ρ, exactly
    assert "by reweighting ρ's held-out trajectories (paired, ± se): seed 5" in out
    evals = json.loads(raw.read_text())["5"]["evals"]
    assert evals["step"] == [0, 1] and evals["tilt_auc"][0] == 0.5
    assert evals["is_gain"][0] == 0.0 and len(evals["is_se"]) == 2
    assert "θ−ρ +0.000 ± 0.000" in out  # step 0: the paired episodes are identical
    assert evals["diff"][0] == 0.0 and evals["diff_se"][0] == 0.0 and len(evals["diff"]) == 2
    assert "paired" in out.split("mean reward (θ trained vs untrained)")[1]
    state = TrainState.from_bytes((tmp_path / "state_seed5_step1.pt").read_bytes())
    assert state.step == 1 and state.adapter
    assert png.stat().st_size > 10_000


def test_tilt_ceiling_prints_the_a6_table() -> None:
    out = _run(
        "experiments/tilt_ceiling.py",
        *("--heldout", "1", "--rollouts", "2", "--replays", "2", "--betas", "2"),
    )
    assert "| family | μ (replayed) | Var_ρ(p) | gain β=2 |" in out
    assert "| mean |" in out


def test_testbed_prints_the_paradigms_and_rho_per_family() -> None:
    """docs/testbed.md's table (before: the script imported a function sim_paradigms no longer
    had, and failed at import)."""
    out = _run(
        "experiments/testbed.py",
        *("--heldout", "1", "--runs", "1", "--threads", "1", "--set", "policy.init=null"),
    )
    assert "SIMULATED:" in out and "6 held-out tasks" in out
    assert "| chain " in out and "| plan_execute " in out and "| ρ " in out
    assert "best paradigm per family:" in out and "families no row wins:" in out


def test_capacity_probe_reports_held_out_and_in_sample_tilt() -> None:
    out = _run(
        "experiments/capacity_probe.py",
        *("--runs", "2", "--epochs", "1", "--heldout", "1", "--eval-runs", "1"),
        *("--set", "sim.n_train_per_family=2"),
    )
    assert "sampled decisions to clone" in out and "epoch 1: mean NLL" in out
    assert "held-out (6 paired episodes): untrained θ" in out
    assert "training trajectories: tilt AUC" in out


def test_pretrained_tiny_backbone_loads_as_a_policy_folder(tmp_path: Path) -> None:
    folder = tmp_path / "tiny-lm"
    out = _run("experiments/pretrain_tiny.py", str(folder), "--episodes", "1", "--epochs", "1")
    assert "epoch 1: mean token NLL" in out
    policy = load_policy(PolicyConfig(backbone=str(folder), lora=LoraConfig(r=4, alpha=8)))
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_folder(cache_root() / "models", 0))
    trained = policy.model.get_base_model()
    assert not torch.equal(
        trained.get_input_embeddings().weight, fresh.get_input_embeddings().weight
    )


def test_paired_difference_pairs_by_record_and_run_and_matches_a_paired_t_test() -> None:
    spec = importlib.util.spec_from_file_location("lc", ROOT / "experiments" / "learning_curve.py")
    lc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lc)
    rng = np.random.default_rng(0)
    keys = [(f"r{i}", k) for i in range(20) for k in range(3)]
    r_t = rng.integers(0, 2, len(keys)).astype(float)
    r_r = rng.integers(0, 2, len(keys)).astype(float)
    theta = pd.DataFrame(keys, columns=["record_id", "rollout_index"]).assign(reward=r_t)
    rho = pd.DataFrame(keys, columns=["record_id", "rollout_index"]).assign(reward=r_r)
    diff, se = lc.paired_difference(theta, rho.sample(frac=1.0, random_state=1))
    t = ttest_rel(r_t, r_r).statistic
    assert diff == pytest.approx(float(np.mean(r_t - r_r)))
    assert diff / se == pytest.approx(t)
    with pytest.raises(ValueError, match="do not pair up"):
        lc.paired_difference(theta, rho.iloc[1:])
