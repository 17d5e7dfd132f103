"""A 2-step train workflow with the artifact store and MLflow's artifacts on S3 (moto_server
on 127.0.0.1, started by the session fixture)."""

from __future__ import annotations

import boto3
from mlflow import MlflowClient
from pipeline_support import isolate_flyte_cache, small_config

from evosteer_core.infra.artifacts import RunIndex, open_store
from evosteer_core.pipeline.stage_io import STEP_ARTIFACTS, TRACKING_FILES
from evosteer_flyte.workflows.train import train


def test_two_step_run_on_s3(s3_bucket, moto_endpoint, tmp_path, monkeypatch):
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg = small_config(
        f"s3://{s3_bucket}/runs",
        **{
            "store.s3_endpoint": moto_endpoint,
            "tracking.tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
            "tracking.artifact_location": f"s3://{s3_bucket}/mlartifacts",
        },
    )
    out = train(config_yaml=cfg.to_yaml(), steps=2)

    assert out.state.uri.startswith(f"s3://{s3_bucket}/runs/objects/")
    store = open_store(cfg.store.root, moto_endpoint)
    index = RunIndex(store, out.run_id)
    assert index.steps() == [0, 1, 2]
    for k in (1, 2):
        refs = index.step_artifacts(k)
        assert set(STEP_ARTIFACTS) <= set(refs)
        assert all(r.uri.startswith(f"s3://{s3_bucket}/") for r in refs.values())
        assert store.get_bytes(refs["state"])  # verified read from S3

    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    keys = [
        o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="mlartifacts/")["Contents"]
    ]
    for k in (1, 2):
        for name in TRACKING_FILES:
            assert any(key.endswith(f"step_{k:04d}/{name}") for key in keys), (name, keys)
    client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
    steps = [m.step for m in client.get_metric_history(out.mlflow_run, "loss")]
    assert sorted(steps) == [1, 2]
    assert client.get_run(out.mlflow_run).info.artifact_uri.startswith(
        f"s3://{s3_bucket}/mlartifacts"
    )
