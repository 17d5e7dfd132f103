"""A cluster-side train that fails ends its MLflow run FAILED (issue 16): the cluster's train
workflow (``launch.train``) has ``fail_tracking`` as its failure handler. flytekit runs the
handler in local execution too, so a local run of that workflow with a failing stage shows it;
``tests/test_launch.py`` checks the packaged workflow's failure node. Before the handler the
run stayed RUNNING until the next train of the run id marked it KILLED."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient
from pipeline_support import isolate_flyte_cache, small_config

from evosteer_core.infra.runs import run_id_for
from evosteer_core.infra.tracking import END_REASON_TAG, RUN_ID_TAG, resolve_tracking
from evosteer_core.pipeline import stage_io
from evosteer_flyte.workflows import launch


def test_a_failed_cluster_train_ends_its_mlflow_run_failed(tmp_path, monkeypatch):
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg = small_config(tmp_path / "runs")

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure in the rollout of step 1")

    monkeypatch.setattr(stage_io, "rollout_stage", broken)
    with pytest.raises(Exception, match="injected failure"):
        launch.train(config_yaml=cfg.to_yaml(), steps=1, rollout_shards=1)
    client = MlflowClient(tracking_uri=resolve_tracking(cfg.tracking, cfg.store)[0])
    experiment = client.get_experiment_by_name(cfg.tracking.experiment).experiment_id
    (run,) = client.search_runs(
        [experiment], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id_for(cfg)}'"
    )
    assert run.info.status == "FAILED"
    assert "injected failure in the rollout of step 1" in run.data.tags[END_REASON_TAG]


def test_the_handler_of_a_train_that_never_opened_a_run_does_nothing(tmp_path):
    """A config the train refused (here a bad key) never opened an MLflow run: the handler
    neither fails on it nor creates tracking."""
    from evosteer_flyte.tasks.tracking_tasks import fail_tracking

    text = f"name: x\nstore: {{root: {tmp_path / 'runs'}}}\ntrain: {{stpes: 1}}\n"
    fail_tracking(config_yaml=text, steps=0, rollout_shards=1)
    assert not (tmp_path / "runs").exists()
