"""MLflow tracking on a temporary sqlite store (and S3 artifacts on moto_server)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import evosteer_core
from evosteer_core.infra.artifacts import LocalStore
from evosteer_core.infra.config import default_config, load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.infra.provenance import (
    CODE_HASH_TAG,
    GIT_COMMIT_TAG,
    VERSION_TAG,
    code_hash,
    git_state,
)
from evosteer_core.infra.runs import config_hash
from evosteer_core.infra.tracking import (
    CONFIG_HASH_TAG,
    END_REASON_TAG,
    EXECUTION_TAG,
    EXECUTIONS_TAG,
    LOGGED_STEP_TAG,
    RESUMED_FROM_TAG,
    STATE_TAG,
    STEP_TAG,
    TRAIN_STEPS_TAG,
    RunTracker,
    closing_on_failure,
    open_run,
    registered_model_name,
    resolve_tracking,
    step_dir,
    tag_registered_adapters,
)


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
    assert "train.steps" not in run.data.params  # a tag: an extended run changes it
    assert run.data.tags[TRAIN_STEPS_TAG] == str(cfg.train.steps)
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


def test_bad_metrics_and_names_are_refused(tracking_uri: str, tmp_path: Path) -> None:
    tracker = RunTracker.start(tracking_uri, "exp-b", "run-b", artifact_location=tmp_path.as_uri())
    with pytest.raises(TypeError, match="step 4"):
        tracker.log_step(4, {"loss": "high"})
    for bad in ("../x", "/abs", "a/../../x", "./x"):
        with pytest.raises(ValueError, match="relative path inside the step"):
            tracker.log_step_artifacts(4, {bad: b""})
    tracker.log_step_artifacts(4, {"adapter/adapter_config.json": b"{}"})
    listed = {f.path for f in tracker.client.list_artifacts(tracker.run_id, "step_0004/adapter")}
    assert listed == {"step_0004/adapter/adapter_config.json"}
    with pytest.raises(Exception, match="no-such-run"):
        RunTracker.attach(tracking_uri, "no-such-run")


def test_location_names_the_run_and_its_ui_page(tracking_uri: str, tmp_path: Path) -> None:
    """What ``record_init`` records for the report; a local store's page is on the ``mlflow
    ui`` that would serve it."""
    tracker = RunTracker.start(
        tracking_uri, "exp-loc", "run-l", artifact_location=tmp_path.as_uri()
    )
    experiment = tracker.client.get_experiment_by_name("exp-loc").experiment_id
    assert tracker.location() == {
        "tracking_uri": tracking_uri,
        "experiment_id": experiment,
        "run_id": tracker.run_id,
        "url": f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{tracker.run_id}",
    }


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


def _cfg(tracking_uri: str, root: Path, experiment: str, **extra):
    overrides = {
        "store.root": str(root),
        "tracking.tracking_uri": tracking_uri,
        "tracking.experiment": experiment,
        **extra,
    }
    return load_config(None, overrides=overrides)


def test_a_train_continues_its_run_and_logs_each_step_once(tracking_uri: str, tmp_path: Path):
    """Before: every execution opened a new MLflow run and re-logged every earlier step. Now a
    second execution (extended: train.steps 3 → 4) continues the run: same MLflow run id, same
    config hash, each step's metric once, the execution history and the code tagged."""
    store = LocalStore(tmp_path / "runs")
    ref = store.put_bytes(b"x", "x.json")
    first = _cfg(tracking_uri, tmp_path / "runs", "exp-continue", **{"train.steps": 3})
    tracker = open_run(first, "run-1", "train", "local:h:e1", resume=True)
    for k in (1, 2, 3):
        tracker.log_training_step(k, {"loss": float(k)}, {"a/b.json": b"{}"}, store, {"x": ref})
    tracker.end()
    assert tracker.logged_step() == 3

    extended = _cfg(tracking_uri, tmp_path / "runs", "exp-continue", **{"train.steps": 4})
    again = open_run(extended, "run-1", "train", "local:h:e2", resume=True)
    assert again.run_id == tracker.run_id and again.logged_step() == 3
    assert RunTracker.attach(tracking_uri, again.run_id).logged_at_attach == 3
    again.log_training_step(4, {"loss": 4.0}, {"a/b.json": b"{}"}, store, {"x": ref})
    assert RunTracker.attach(tracking_uri, again.run_id).logged_at_attach == 4
    again.end()
    run = again.client.get_run(again.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[CONFIG_HASH_TAG] == config_hash(first) == config_hash(extended)
    assert run.data.tags[TRAIN_STEPS_TAG] == "4" and run.data.tags[LOGGED_STEP_TAG] == "4"
    assert run.data.tags[RESUMED_FROM_TAG] == "FINISHED"
    assert run.data.tags[EXECUTION_TAG] == "local:h:e2"
    assert run.data.tags[EXECUTIONS_TAG] == "local:h:e1 local:h:e2"
    assert run.data.tags[VERSION_TAG] == evosteer_core.__version__
    assert run.data.tags[CODE_HASH_TAG] == code_hash()
    assert run.data.tags[GIT_COMMIT_TAG] == git_state()[0]  # the tests run in a checkout
    history = again.client.get_metric_history(again.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(k, float(k)) for k in (1, 2, 3, 4)]
    text = Path(again.client.download_artifacts(again.run_id, "config.yaml", str(tmp_path)))
    assert "steps: 4" in text.read_text()  # the current config; params keep their first values

    other = _cfg(tracking_uri, tmp_path / "runs", "exp-continue", **{"train.seed": 9})
    assert open_run(other, "run-1", "train", "e3", resume=True).run_id != tracker.run_id
    evals = {open_run(first, "run-1", "evaluate", f"e{i}", resume=False).run_id for i in (4, 5)}
    assert len(evals) == 2 and tracker.run_id not in evals


def test_a_run_left_running_is_killed_then_continued(tracking_uri: str, tmp_path: Path):
    cfg = _cfg(tracking_uri, tmp_path / "runs", "exp-stale")
    dead = open_run(cfg, "run-2", "train", "e1", resume=True)  # its process "died": no end
    again = open_run(cfg, "run-2", "train", "e2", resume=True)
    run = again.client.get_run(again.run_id)
    assert again.run_id == dead.run_id and run.info.status == "RUNNING"
    assert run.data.tags[RESUMED_FROM_TAG] == "KILLED"
    assert run.data.tags[END_REASON_TAG].startswith("left RUNNING by a process that died")


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (RuntimeError("injected\nfailure at http://user:secret@host/x?token=t0k"), "FAILED"),
        (KeyboardInterrupt(), "KILLED"),
        (SystemExit(143), "KILLED"),
    ],
)
def test_a_failing_or_interrupted_train_ends_its_run(tracking_uri, tmp_path, error, status):
    cfg = _cfg(tracking_uri, tmp_path / "runs", f"exp-fail-{status}-{type(error).__name__}")
    tracker = open_run(cfg, "run-3", "train", "e1", resume=True)
    with pytest.raises(type(error)), closing_on_failure(cfg, "run-3", "train"):
        raise error
    run = tracker.client.get_run(tracker.run_id)
    assert run.info.status == status
    assert run.data.tags[END_REASON_TAG].startswith(type(error).__name__)
    assert "\n" not in run.data.tags[END_REASON_TAG]
    assert (
        "secret" not in run.data.tags[END_REASON_TAG] and "t0k" not in run.data.tags[END_REASON_TAG]
    )


def test_an_unreachable_mlflow_does_not_hide_the_error(tmp_path: Path):
    (tmp_path / "file").write_text("")  # a database "inside" a file: MLflow cannot open it
    cfg = _cfg(f"sqlite:///{tmp_path / 'file' / 'mlflow.db'}", tmp_path / "runs", "exp-down")
    with pytest.raises(RuntimeError, match="the real error"), closing_on_failure(cfg, "r", "train"):
        raise RuntimeError("the real error")


def test_register_adapter_once_per_state_with_evaluation_tags(tracking_uri, tmp_path):
    cfg = _cfg(tracking_uri, tmp_path / "runs", "exp-registry")
    tracker = open_run(cfg, "run-4", "train", "e1", resume=True)
    tracker.log_step_artifacts(1, {"adapter/adapter_config.json": b"{}"})
    evaluation = open_run(cfg, "run-4", "evaluate", "e2", resume=False)
    evaluation.log_step(0, {"eval.hotpotqa.mean": 0.25, "eval.hotpotqa.std": 0.5, "other": 1})
    evaluation.set_tags({"sha256.checkpoint": "s1"})
    evaluation.end()

    name = registered_model_name(cfg)
    version = tracker.register_adapter(name, 1, "s1", {"evosteer.config_hash": "h"})
    assert tracker.register_adapter(name, 1, "s1", {}).version == version.version
    assert version.source == f"runs:/{tracker.run_id}/step_0001/adapter"
    got = tracker.client.get_model_version(name, version.version)
    assert got.run_id == tracker.run_id
    assert got.tags["evosteer.config_hash"] == "h" and got.tags[STEP_TAG] == "1"
    assert got.tags[STATE_TAG] == "s1" and got.tags[CODE_HASH_TAG] == code_hash()
    assert got.tags["eval.hotpotqa.mean"] == "0.25" and "other" not in got.tags

    assert tag_registered_adapters(cfg, name, "s1", {"eval.iid_avg.mean": 0.125}) == [1]
    assert tag_registered_adapters(cfg, name, "unknown", {"eval.x": 1.0}) == []
    assert tag_registered_adapters(cfg, "no-such-model", "s1", {"eval.x": 1.0}) == []
    got = tracker.client.get_model_version(name, version.version)
    assert got.tags["eval.iid_avg.mean"] == "0.125"


def test_code_hash_covers_every_source_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The hash equals an independent sha256 over (path, size, bytes) of the copied packages and
    changes with one byte; outside a git checkout there is no commit tag."""
    import hashlib
    import shutil

    from evosteer_core.infra import provenance

    for pkg in provenance.PACKAGES:
        src = Path(provenance.__file__).resolve().parents[2] / pkg
        shutil.copytree(src, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(
        provenance, "_package_dirs", lambda: [tmp_path / p for p in provenance.PACKAGES]
    )

    def expected() -> str:
        digest = hashlib.sha256()
        for path in sorted(tmp_path.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".yaml", ".json", ".txt"):
                data = path.read_bytes()
                rel = path.relative_to(tmp_path).as_posix()
                digest.update(f"{rel}\0{len(data)}\0".encode() + data)
        return digest.hexdigest()

    provenance.code_hash.cache_clear()
    provenance.git_state.cache_clear()
    try:
        before = provenance.code_hash()
        assert before == expected()
        target = tmp_path / "evosteer_core" / "infra" / "runs.py"
        target.write_bytes(target.read_bytes() + b"#")
        provenance.code_hash.cache_clear()
        assert provenance.code_hash() == expected() != before
        tags = provenance.code_tags()
        assert GIT_COMMIT_TAG not in tags and tags[CODE_HASH_TAG] == expected()
    finally:
        provenance.code_hash.cache_clear()
        provenance.git_state.cache_clear()
