"""experiments/checkpoint_tilt.py and probe_session.stored_checkpoint on a recorded two-state
run: the untrained checkpoint has no tilt at all, a trained one some, and a missing step is
named."""

from __future__ import annotations

import pytest
import torch

from evosteer_core.episode.world import build_world
from evosteer_core.infra.artifacts import MissingArtifactError, RunIndex, open_store
from evosteer_core.infra.config import load_config
from evosteer_core.infra.runs import record_config, run_id_for
from evosteer_core.pipeline.stage_io import StepStore
from evosteer_core.training.loop import train_step
from evosteer_core.training.session import init_state, open_session
from experiments.admission_gain import admission_gain
from experiments.checkpoint_tilt import checkpoint_tilt
from experiments.probe_session import stored_checkpoint


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A run of the embedded preset (2 records a step) stored with its states at steps 0 and 1."""
    torch.set_num_threads(1)
    root = str(tmp_path_factory.mktemp("store"))
    cfg = load_config(
        None,
        overrides={
            "store.root": root,
            "train.batch_size": 2,
            "train.rollouts_theta": 1,
            "train.rollouts_rho": 1,
            "sim.n_heldout_per_family": 2,
        },
    )
    store, run = open_store(root), run_id_for(cfg)
    record_config(store, run, cfg)
    index, steps = RunIndex(store, run), StepStore(store)
    state = init_state(cfg)
    index.record(0, "state", steps.put_state(state))
    state, _ = train_step(open_session(cfg, state, build_world(cfg)), state, 1)
    index.record(1, "state", steps.put_state(state))
    return root, run, state


def test_stored_checkpoint_is_the_recorded_state_of_the_last_step_by_default(recorded):
    root, run, state = recorded
    cfg, got, at = stored_checkpoint(root, run, overrides={"train.grad_clip": 5.0})
    assert at == got.step == 1 and got.adapter.keys() == state.adapter.keys()
    assert all(torch.equal(got.adapter[k], state.adapter[k]) for k in state.adapter)
    assert cfg.train.grad_clip == 5.0 and cfg.train.batch_size == 2
    with pytest.raises(MissingArtifactError, match="no artifact 'state' at step 7"):
        stored_checkpoint(root, run, 7)


def test_the_untrained_checkpoint_has_no_tilt_and_the_trained_one_some(recorded):
    root, run, _ = recorded
    before = checkpoint_tilt(root, run, 0, "heldout", 1)
    assert before["episodes"] == 12
    assert (before["auc"], before["gap"], before["gain"], before["se"]) == (0.5, 0.0, 0.0, 0.0)
    assert before["mean_abs_w"] == 0.0
    after = checkpoint_tilt(root, run, None, "heldout", 1)
    assert after["step"] == 1 and after["mean_abs_w"] > 0
    assert after["rho"] == before["rho"]  # ρ's episodes are the same at every step


def test_admission_gain_evaluates_the_last_step_the_store_holds(recorded):
    """Not the recorded config's train.steps: a run extended past it (or stopped before it)
    is evaluated at its last checkpoint."""
    root, run, _ = recorded
    r = admission_gain(root, run, 1)
    assert r["step"] == 1 and set(r["arms"]) == {
        "validated only",
        "with candidates under test",
        "admit every candidate",
        "no skills",
    }
