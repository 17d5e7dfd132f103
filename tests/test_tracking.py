"""MLflow tracking on a temporary sqlite store (and S3 artifacts on moto_server)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evosteer_core.infra.artifacts import LocalStore
from evosteer_core.infra.config import default_config, load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.infra.runs import config_hash
from evosteer_core.infra.tracking import CONFIG_HASH_TAG, RunTracker, resolve_tracking, step_dir


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_resolve_tracking_defaults(tmp_path: Path) -> None:
    cfg = load_config(None, overrides={"store.root": str(tmp_path)})
    uri, location = resolve_tracking(cfg.tracking, cfg.store)
    assert uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert location == (tmp_path.resolve() / "mlartifacts").as_uri()
    s3 = load_config(None, overrides={"store.root": "s3://b/p"})
    with pytest.raises(ConfigError, match="tracking.tracking_uri: required"):
        resolve_tracking(s3.tracking, s3.store)
    s3 = load_config(
        None, overrides={"store.root": "s3://b/p", "tracking.tracking_uri": "http://m"}
    )
    assert resolve_tracking(s3.tracking, s3.store) == ("http://m", "s3://b/p/mlartifacts")


def test_run_params_metrics_artifacts_tags_and_resume(tracking_uri: str, tmp_path: Path) -> None:
    cfg = default_config()
    tracker = RunTracker.start(
        tracking_uri,
        "exp-a",
        "run-a",
        cfg,
        tags={"flyte.execution_id": "f123"},
        artifact_location=(tmp_path / "art").as_uri(),
    )
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    metrics = {
        "reward_theta": 0.5,
        "reward_rho": 0.25,
        "loss": 1.5,
        "loss_anchor_only": 1.25,
        "value_mse": 0.1,
        "anchor_auc": 0.7,
        "skills_candidate": 1,
        "skills_validated": 0,
        "skills_retired": 0,
        "alpha_spent": 0.0125,
    }
    tracker.log_step(1, metrics)
    tracker.log_step(2, {"loss": 1.0, "custom_metric": True})
    adapter = tmp_path / "adapter.safetensors"
    adapter.write_bytes(b"weights")
    tracker.log_step_artifacts(2, {"adapter.safetensors": adapter, "skills.json": b"[]"})
    tracker.end()

    client = tracker.client
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == str(cfg.train.steps)
    assert run.data.params["anchors.kappa"] == "[2.0,4.0,0.5]"
    assert run.data.tags["flyte.execution_id"] == "f123"
    assert run.data.tags[CONFIG_HASH_TAG] == config_hash(cfg)
    history = client.get_metric_history(tracker.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.5), (2, 1.0)]
    assert run.data.metrics["custom_metric"] == 1.0
    assert set(metrics) <= set(run.data.metrics)
    listed = {f.path for f in client.list_artifacts(tracker.run_id, step_dir(2))}
    assert listed == {"step_0002/adapter.safetensors", "step_0002/skills.json"}
    top = {f.path for f in client.list_artifacts(tracker.run_id)}
    assert {"config.yaml", "step_0002"} <= top
    got = client.download_artifacts(tracker.run_id, "step_0002/adapter.safetensors", str(tmp_path))
    assert Path(got).read_bytes() == b"weights"

    resumed = RunTracker.attach(tracking_uri, tracker.run_id)
    resumed.log_step(3, {"loss": 0.5})
    resumed.set_tags({"flyte.execution_id": "f456"})
    resumed.end("FAILED")
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FAILED" and run.data.tags["flyte.execution_id"] == "f456"
    assert len(client.get_metric_history(tracker.run_id, "loss")) == 3


def test_bad_metrics_and_names_are_refused(tracking_uri: str) -> None:
    tracker = RunTracker.start(tracking_uri, "exp-b", "run-b")
    with pytest.raises(TypeError, match="step 4"):
        tracker.log_step(4, {"loss": "high"})
    with pytest.raises(ValueError, match="plain file name"):
        tracker.log_step_artifacts(4, {"../x": b""})
    with pytest.raises(Exception, match="no-such-run"):
        RunTracker.attach(tracking_uri, "no-such-run")


def test_from_config_and_store_refs(tracking_uri: str, tmp_path: Path) -> None:
    # Shares the module's database (each new sqlite store costs ~10 s of migrations here);
    # the default URI under the store root is covered by test_resolve_tracking_defaults.
    overrides = {
        "store.root": str(tmp_path / "runs"),
        "tracking.tracking_uri": tracking_uri,
        "tracking.experiment": "exp-from-config",
    }
    cfg = load_config(None, overrides=overrides)
    store = LocalStore(cfg.store.root)
    tracker = RunTracker.from_config(cfg, tags={"flyte.execution_id": "x"})
    ref = store.put_bytes(b"ledger", "ledger.json")
    tracker.log_step_refs(7, store, {"ledger.json": ref})
    assert tracker.client.get_run(tracker.run_id).info.run_name == cfg.name
    run = tracker.client.get_run(tracker.run_id)
    assert run.data.tags["sha256.ledger.json"] == ref.sha256
    assert run.info.artifact_uri.startswith((tmp_path / "runs" / "mlartifacts").resolve().as_uri())
    base = Path(
        tracker.client.download_artifacts(tracker.run_id, step_dir(7), str(tmp_path / "dl"))
    )
    assert (base / "ledger.json").read_bytes() == b"ledger"
    refs = json.loads((base / "refs.json").read_text())
    assert refs == {"ledger.json": {"uri": ref.uri, "sha256": ref.sha256}}


def test_s3_artifacts_on_moto(
    moto_endpoint: str, s3_bucket: str, tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_S3_ENDPOINT_URL", raising=False)
    tracker = RunTracker.start(
        tracking_uri,
        f"exp-s3-{s3_bucket}",
        "run-s3",
        artifact_location=f"s3://{s3_bucket}/mlflow",
        s3_endpoint=moto_endpoint,
    )
    tracker.log_step_artifacts(0, {"heads.pt": b"heads"})
    import boto3

    keys = [
        o["Key"]
        for o in boto3.client("s3", endpoint_url=moto_endpoint)
        .list_objects_v2(Bucket=s3_bucket)
        .get("Contents", [])
    ]
    assert any(k.endswith("artifacts/step_0000/heads.pt") for k in keys), keys
