"""experiments/admission_gain.py on a stored two-step run whose library holds candidates: its
"validated only" arm is the experiment's evaluation of the cell, and each other arm is the same
checkpoint evaluated with that arm's menus (built here from the library's statuses)."""

from __future__ import annotations

import pytest

from evosteer_core.episode.world import load_records
from evosteer_core.evaluation.rows import row_rollouts
from evosteer_core.experiment.cells import EVALUATION_TAG, cell_trajectories
from evosteer_core.infra.artifacts import LocalStore, RunIndex
from evosteer_core.infra.runs import record_config, run_id_for
from evosteer_core.pipeline import stage_io
from evosteer_core.skills.library import SkillLibrary
from evosteer_core.training.session import open_session
from experiments.admission_gain import admission_gain, heldout_mean
from experiments.skill_lifecycle import with_library
from tests.pipeline_support import small_config


@pytest.mark.slow
def test_each_arm_is_the_checkpoint_under_that_arms_menus(tmp_path):
    root = tmp_path / "runs"
    cfg = small_config(root, **{"train.steps": 2})
    store = LocalStore(root)
    run = run_id_for(cfg)
    record_config(store, run, cfg)
    io_ = stage_io.StepStore(store)
    index = RunIndex(store, run)
    state_ref = stage_io.init_artifacts(cfg, io_)
    for step in (1, 2):
        refs = stage_io.run_step(cfg, io_, state_ref, step)
        for name, ref in refs.items():  # what the workflow's record task writes
            index.record(step, name, ref)
        state_ref = refs["state"]
    state = io_.get_state(state_ref)

    out = admission_gain(str(root), run, runs=1)
    arms = out["arms"]
    library = open_session(cfg, state).skills.library
    statuses = [e.status for e in library.entries]
    assert "candidate" in statuses and "validated" not in statuses  # the case of the tables

    # validated only = what `evosteer experiment` reports for this cell; with nothing
    # validated it deploys no skill: the empty library's episodes
    session = with_library(open_session(cfg, state), SkillLibrary())
    heldout = load_records(cfg)[1]
    empty = heldout_mean(row_rollouts(session, "checkpoint", heldout, 1, EVALUATION_TAG))
    assert heldout_mean(cell_trajectories(cfg, state, "checkpoint", 1)) == empty
    assert arms["validated only"] == arms["no skills"] == {"mean": empty, "menu": 0}
    # the training menus offer each family's candidate under test
    assert arms["with candidates under test"]["menu"] == statuses.count("candidate")
    assert arms["admit every candidate"]["menu"] == len(statuses)
    assert out["step"] == 2 and out["seed"] == cfg.train.seed
