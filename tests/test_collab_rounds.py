"""CollabFlow training rounds through the pipeline (docs/collabflow.md §4): a 2-round run of
``method: collabflow`` through the Flyte train workflow, its in-process replay (``evosteer
replay`` reruns a round through ``stage_io.run_step``), the evaluation of its checkpoint (30 s together on a
quiet 2-core machine, so they stay in the default suite), and the rule that aborted
constructions are never trained on."""

from __future__ import annotations

import io

import pytest
import torch
from pipeline_support import assert_states_save_as_asdict, isolate_flyte_cache

from evosteer_core.collabflow.reward import ReliabilityCounters
from evosteer_core.collabflow.rounds import (
    init_round_state,
    open_round,
    round_rollout,
    round_update,
    trained_rows,
)
from evosteer_core.infra.artifacts import RunIndex, open_store
from evosteer_core.infra.config import load_config
from evosteer_core.infra.runs import run_id_for
from evosteer_core.pipeline import stage_io
from evosteer_core.training.state import TrainState
from evosteer_flyte.cli import main as cli_main
from evosteer_flyte.workflows.train import train

SMALL = {
    "train.batch_size": 6,
    "train.rollouts_theta": 1,
    "sim.n_train_per_family": 2,
    "sim.n_heldout_per_family": 1,
    "collabflow.max_agents": 2,
    "collabflow.max_edges": 1,
}
"""The smallest collabflow-sim run: one task per family, teams of at most 2 agents."""


def small(root, **extra):
    return load_config("configs/collabflow-sim.yaml", {**SMALL, "store.root": str(root), **extra})


@pytest.fixture(scope="module")
def flyte_run(tmp_path_factory):
    """A finished 2-round run through the train workflow (Flyte local execution)."""
    with pytest.MonkeyPatch.context() as mp:
        isolate_flyte_cache(mp, tmp_path_factory.mktemp("home"))
        cfg = small(tmp_path_factory.mktemp("run"))
        out = train(config_yaml=cfg.to_yaml(), steps=2)
        yield cfg, out


def test_two_rounds_record_their_artifacts_and_count_after_the_batch(flyte_run):
    cfg, out = flyte_run
    index = RunIndex(open_store(cfg.store.root), out.run_id)
    assert index.steps() == [0, 1, 2]
    assert set(index.step_artifacts(2)) == {"trajectories", "decisions", "round", "state"}
    steps = stage_io.StepStore(open_store(cfg.store.root))
    refs = index.step_artifacts(1)
    trained = trained_rows(steps.get_table(refs["trajectories"]))
    after1 = ReliabilityCounters.from_dict(steps.get_state(refs["state"]).counters)
    assert sum(n for _, n in after1.counts.values()) == len(trained)  # each outcome once
    metrics = stage_io.step_metrics(steps, refs)
    assert metrics["n_trajectories"] == len(trained)
    assert {"loss", "balance", "kl", "reward_theta", "abort_rate", "healthy_fraction"} <= set(
        metrics
    )


def test_round_states_save_the_bytes_of_their_fields_as_asdict_copied_them(flyte_run):
    cfg, out = flyte_run
    assert assert_states_save_as_asdict(cfg.store.root, out.run_id) == 3  # rounds 0, 1, 2


def test_replay_of_a_round_is_identical(flyte_run, capsys):
    cfg, out = flyte_run
    args = ["replay", "--run-dir", cfg.store.root, "--run", out.run_id, "--step", "2"]
    assert cli_main(args) == 0
    text = capsys.readouterr().out
    for name in ("trajectories", "decisions", "round", "state"):
        assert f"{name}: identical" in text
    assert "every artifact identical" in text


def test_evaluate_a_collabflow_checkpoint_on_held_out_tasks(flyte_run, capsys):
    cfg, out = flyte_run
    argv = ["evaluate", "--run-dir", cfg.store.root, "--run", out.run_id, "--step", "2"]
    assert cli_main([*argv, "--runs", "1"]) == 0
    text = capsys.readouterr().out
    assert "iid avg" in text and "hotpotqa" in text


def test_aborted_constructions_are_never_trained_on(tmp_path):
    """B_con of one token: every construction aborts at its first decision; the round then
    trains on nothing (adapter and optimizer unchanged) and counts nothing."""
    cfg = small(tmp_path, **{"collabflow.construction_tokens": 1})
    state = init_round_state(cfg)
    s = open_round(cfg, state)
    rollouts = round_rollout(s, 1)
    traj = rollouts.trajectories
    assert traj["aborted"].all() and (traj["execution_tokens"] == 0).all()
    assert traj["abort_reason"].str.contains("B_con").all()
    update = round_update(s, rollouts, state.actor_optimizer)
    assert update.metrics["n_trajectories"] == 0 and update.metrics["abort_rate"] == 1.0
    assert update.counters == ReliabilityCounters().to_dict()
    for k, v in state.adapter.items():
        assert torch.equal(update.adapter[k], v)
    assert update.actor_optimizer is state.actor_optimizer


def test_collabflow_run_ids_and_states_are_apart_from_evosteer(tmp_path):
    """A collabflow state carries the counters; an EvoSteer state's bytes have no such key."""
    cfg = small(tmp_path)
    assert run_id_for(cfg).startswith("collabflow-sim-")
    state = init_round_state(cfg)
    assert state.counters and TrainState.from_bytes(state.to_bytes()).counters == state.counters
    evo = TrainState(0, {}, {}, {}, {}, {}, {}, {})
    assert "counters" not in torch.load(io.BytesIO(evo.to_bytes()))
