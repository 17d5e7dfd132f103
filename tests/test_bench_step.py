"""scripts/bench_step.py --rounds: the rollout's lock-step rounds, checked against the step's
own decision table (one decision per pending episode per round); --after K: step K+1 timed,
from the state K untimed steps left."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_step.py"


@pytest.fixture()
def bench_step(monkeypatch):
    """The script as a module; the functions it wraps are put back after the test."""
    spec = importlib.util.spec_from_file_location("bench_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loop = importlib.import_module("evosteer_core.training.loop")
    rollout = importlib.import_module("evosteer_core.episode.rollout")
    for name in module.STAGES:
        monkeypatch.setattr(loop, name, getattr(loop, name))
    for name in ("_choose", "_run_rounds"):
        monkeypatch.setattr(rollout, name, getattr(rollout, name))
    return module


def _args(after: int, rounds: bool) -> argparse.Namespace:
    """The script's options for a small step (2 records, 1θ + 1ρ)."""
    return argparse.Namespace(
        config=None,
        batch=2,
        rollouts=1,
        threads=torch.get_num_threads(),
        step=1,
        after=after,
        rounds=rounds,
    )


def test_rounds_match_the_decision_table(bench_step, monkeypatch):
    tables = {}
    loop = importlib.import_module("evosteer_core.training.loop")
    rollout_stage = loop.rollout_stage

    def keep(*a, **kw):
        out = rollout_stage(*a, **kw)
        tables["decisions"] = out.decisions if hasattr(out, "decisions") else out[1]
        return out

    monkeypatch.setattr(loop, "rollout_stage", keep)
    r = bench_step.measure(_args(after=0, rounds=True))
    decisions = tables["decisions"]
    per_episode = decisions.groupby("traj_id").size()
    rounds = r["rounds"]
    assert len(rounds) == per_episode.max()
    assert [x["episodes"] for x in rounds] == [
        int((per_episode > k).sum()) for k in range(len(rounds))
    ]
    assert sum(x["episodes"] for x in rounds) == len(decisions) == r["decisions"]
    assert all(x["decide_s"] >= 0 and x["act_s"] >= 0 for x in rounds)
    assert sum(x["decide_s"] + x["act_s"] for x in rounds) <= r["wall"]["rollout"]


def test_rounds_with_vs_is_one_line_exit_2():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "--vs", "HEAD"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--rounds" in done.stderr and "--vs" in done.stderr
    assert "Traceback" not in done.stderr


def test_after_times_the_step_after_the_untimed_ones(bench_step, monkeypatch):
    loop = importlib.import_module("evosteer_core.training.loop")
    train_step, rollout_stage = loop.train_step, loop.rollout_stage
    steps, tables = [], {}

    def record_step(s, state, step):
        steps.append((state.step, step))
        return train_step(s, state, step)

    def record_rollout(s, step, *a, **kw):
        out = rollout_stage(s, step, *a, **kw)
        tables[step] = out.decisions
        return out

    monkeypatch.setattr(loop, "train_step", record_step)
    monkeypatch.setattr(loop, "rollout_stage", record_rollout)
    r = bench_step.measure(_args(after=1, rounds=False))
    # each step starts from the state the one before it left; the figures are step 2's
    assert steps == [(0, 1), (1, 2)]
    assert r["decisions"] == len(tables[2])
    assert r["trajectories"] == tables[2]["traj_id"].nunique()
    assert r["wall"]["rollout"] > 0


def test_after_with_step_is_one_line_exit_2():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--after", "3", "--step", "2"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--after" in done.stderr and "--step" in done.stderr
    assert "Traceback" not in done.stderr
