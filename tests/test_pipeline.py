"""The train workflow run locally in-process: MLflow per step, resume by cache, crash-resume,
and the replay command (bit-identical, then a tampered artifact named)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from pipeline_support import (
    SMALL,
    assert_states_save_as_asdict,
    count_stage_calls,
    isolate_flyte_cache,
    small_config,
)

from evosteer_core.infra.artifacts import RunIndex, object_key, open_store
from evosteer_core.infra.provenance import CODE_HASH_TAG, GIT_COMMIT_TAG, VERSION_TAG
from evosteer_core.infra.runs import config_hash, run_id_for
from evosteer_core.infra.tracking import (
    CONFIG_HASH_TAG,
    END_REASON_TAG,
    EXECUTION_TAG,
    EXECUTIONS_TAG,
    RESUMED_FROM_TAG,
    STATE_TAG,
    TRAIN_STEPS_TAG,
    registered_model_name,
    resolve_tracking,
)
from evosteer_core.pipeline import stage_io as core
from evosteer_core.pipeline.stage_io import STEP_ARTIFACTS, TRACKING_FILES
from evosteer_core.policy.adapter_export import ADAPTER_FILES
from evosteer_flyte.cli import main as cli_main
from evosteer_flyte.workflows.train import train

METRICS = (
    "reward_theta",
    "reward_rho",
    "loss",
    "anchor_only_loss",
    "value_mse",
    "anchor_auc",
    "skills_candidate",
    "skills_validated",
    "skills_retired",
    "alpha_spent",
    "nonfinite_skipped",
)


@pytest.fixture(scope="module")
def flyte_env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        isolate_flyte_cache(mp, tmp_path_factory.mktemp("home"))
        yield mp


@pytest.fixture(scope="module")
def base_run(flyte_env, tmp_path_factory):
    """A finished 3-step run (shared: later tests extend, crash-compare and replay it)."""
    cfg = small_config(tmp_path_factory.mktemp("run"))
    out = train(config_yaml=cfg.to_yaml(), steps=3)
    return cfg, out


def _mlflow(cfg):
    return MlflowClient(tracking_uri=resolve_tracking(cfg.tracking, cfg.store)[0])


def test_three_steps_log_every_metric_and_adapter_per_step(base_run):
    cfg, out = base_run
    assert out.run_id == run_id_for(cfg)
    client = _mlflow(cfg)
    run = client.get_run(out.mlflow_run)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.batch_size"] == "6"
    assert run.data.tags["flyte.execution_id"]
    for name in METRICS:
        steps = [m.step for m in client.get_metric_history(out.mlflow_run, name)]
        assert sorted(steps) == [1, 2, 3], name
    for k in (1, 2, 3):
        files = set(_artifact_files(client, out.mlflow_run, f"step_{k:04d}"))
        assert files == {f"step_{k:04d}/{n}" for n in (*TRACKING_FILES, "refs.json")}
    assert run.data.tags[EXECUTION_TAG].startswith("local:")  # not flytekit's local:local:local
    assert run.data.tags[EXECUTION_TAG] != "local:local:local"
    assert {VERSION_TAG, CODE_HASH_TAG, GIT_COMMIT_TAG} <= set(run.data.tags)
    (version,) = client.search_model_versions(f"name = '{registered_model_name(cfg)}'")
    assert version.source == f"runs:/{out.mlflow_run}/step_0003/adapter"
    assert version.tags[CONFIG_HASH_TAG] == config_hash(cfg)
    assert version.tags[STATE_TAG] == out.state.sha256 and version.tags["evosteer.step"] == "3"
    index = RunIndex(open_store(cfg.store.root), out.run_id)
    assert index.steps() == [0, 1, 2, 3]
    for k in (1, 2, 3):
        assert set(index.step_artifacts(k)) == set(STEP_ARTIFACTS)
    assert index.lookup(3, "state") == out.state
    assert run.data.tags["sha256.state"] == out.state.sha256


def test_states_save_the_bytes_of_their_fields_as_asdict_copied_them(base_run):
    cfg, out = base_run
    assert assert_states_save_as_asdict(cfg.store.root, out.run_id) == 4  # steps 0-3


def test_step_metrics_are_read_once_a_process_and_equal_a_fresh_read(base_run, monkeypatch):
    """The training Deck redraws every step so far, and MLflow and the progress bar ask for
    each step's metrics too: through ``stage_io.STEP_METRICS`` a step's artifacts are loaded
    once, and the history equals one read from the store with an empty memo."""
    import pandas as pd

    from evosteer_core.infra.memo import BoundedMemo
    from evosteer_core.pipeline.report import run_history

    cfg, _ = base_run
    store, run_id = open_store(cfg.store.root), run_id_for(cfg)
    assert len(core.STEP_METRICS) >= 3  # the run's tasks went through it
    loads = []
    plain_get = core.StepStore.get_object
    monkeypatch.setattr(
        core.StepStore, "get_object", lambda io, ref: loads.append(ref) or plain_get(io, ref)
    )
    kept = run_history(store, run_id)
    assert loads == []  # the run's own tasks had read every step
    monkeypatch.setattr(core, "STEP_METRICS", BoundedMemo(16))
    fresh = run_history(store, run_id)
    read_once = len(loads)
    again = run_history(store, run_id)
    assert read_once >= 3 and len(loads) == read_once  # the second history loaded nothing
    pd.testing.assert_frame_equal(kept, fresh)
    pd.testing.assert_frame_equal(again, fresh)
    ref = RunIndex(store, run_id).step_artifacts(1)
    changed = {**ref, "value": ref["update"]}  # another artifact: another key, read anew
    assert core.step_metrics(core.StepStore(store), changed) != core.step_metrics(
        core.StepStore(store), ref
    )


def test_the_progress_bar_lists_once_then_looks_up_the_next_state(base_run, tmp_path, monkeypatch):
    """After its first poll, the progress bar finds a new step by its state alone (no listing
    that grows with the run); a step recorded without its state is not finished yet; the
    spend it shows equals ``costs.run_spend`` of the same records."""
    import dataclasses

    from evosteer_core.infra.artifacts import LocalStore
    from evosteer_core.pipeline.costs import money, run_spend
    from evosteer_flyte.console import StepProgress

    cfg, _ = base_run
    run_id = run_id_for(cfg)
    shutil.copytree(cfg.store.root, tmp_path / "store")
    store = LocalStore(tmp_path / "store")
    priced = dataclasses.replace(cfg, prices=dataclasses.replace(cfg.prices, cpu_hour=3.6e5))
    listed: list[str] = []
    plain = LocalStore.list_entries
    monkeypatch.setattr(
        LocalStore, "list_entries", lambda st, prefix: listed.append(prefix) or plain(st, prefix)
    )
    index = RunIndex(store, run_id)
    progress = StepProgress(index, total=5, cfg=priced)
    progress._update()
    assert progress.bar.n == 3 and progress.last[0] == 3
    spent = run_spend(priced, store, run_id, through=3).total
    assert spent > 0 and progress.last[1].endswith(f"spent {money(priced, spent)}")
    three = index.step_artifacts(3)
    listed.clear()
    progress._update()
    assert listed == []  # nothing new: one lookup of step 4's state
    index.record(4, "trajectories", three["trajectories"])  # step 4 partly recorded
    progress._update()
    assert progress.bar.n == 3 and listed == []
    for name, ref in three.items():
        index.record(4, name, ref)
    progress._update()
    assert progress.bar.n == 4 and progress.last[0] == 4
    assert not any(prefix.startswith(f"index/{run_id}/steps") and prefix.count("/") == 2
                   for prefix in listed)  # the index was not listed again
    progress.bar.close()


def test_extending_to_four_steps_executes_only_step_four(base_run, flyte_env, monkeypatch):
    """Only step 4 runs its stages; the record task of a step its MLflow run holds already
    draws no Deck and reads no spend (before: both, every execution, over every step so far)."""
    from evosteer_flyte.tasks import tracking_tasks

    cfg, first = base_run
    calls = count_stage_calls(flyte_env)
    spends, decks = [], []
    plain_spend, plain_deck = tracking_tasks.costs.run_spend, tracking_tasks.Deck
    monkeypatch.setattr(
        tracking_tasks.costs,
        "run_spend",
        lambda *a, through=None: spends.append(through) or plain_spend(*a, through=through),
    )
    monkeypatch.setattr(tracking_tasks, "Deck", lambda *a: decks.append(a) or plain_deck(*a))
    out = train(config_yaml=cfg.to_yaml(), steps=4)
    assert spends == [4] and len(decks) == 1  # the new step's, at the run's last step
    assert {k: v for k, v in calls.items() if k[1] is not None} == {
        ("rollout_stage", 4): 1,
        ("validation_stage", 4): 1,
        ("checkpoint_stage", 4): 1,
    }
    assert calls[("rescore_stage", None)] == calls[("update_stage", None)] == 1
    index = RunIndex(open_store(cfg.store.root), out.run_id)
    assert out.run_id == first.run_id and index.steps() == [0, 1, 2, 3, 4]
    assert index.lookup(3, "state") == first.state  # the cached steps are the same artifacts
    client = _mlflow(cfg)
    step_one = _artifact_path(
        client, first.mlflow_run, "step_0001/adapter/adapter_model.safetensors"
    )
    uploaded = step_one.stat().st_mtime_ns
    # before: every execution opened a new MLflow run and re-uploaded every earlier step
    assert out.mlflow_run == first.mlflow_run  # one MLflow run per training run
    for name in METRICS:
        steps = [m.step for m in client.get_metric_history(out.mlflow_run, name)]
        assert sorted(steps) == [1, 2, 3, 4], name  # each step logged once
    assert step_one.stat().st_mtime_ns == uploaded  # step 1 was not uploaded again
    run = client.get_run(out.mlflow_run)
    assert run.info.status == "FINISHED" and run.data.tags[RESUMED_FROM_TAG] == "FINISHED"
    assert run.data.tags[CONFIG_HASH_TAG] == config_hash(cfg)  # extending keeps the hash
    assert run.data.tags[TRAIN_STEPS_TAG] == "4" and run.data.params["train.batch_size"] == "6"
    assert len(run.data.tags[EXECUTIONS_TAG].split()) == 2
    versions = client.search_model_versions(f"name = '{registered_model_name(cfg)}'")
    assert sorted((v.version, v.tags["evosteer.step"]) for v in versions) == [(1, "3"), (2, "4")]


def test_registered_adapter_reproduces_a_recorded_log_prob_in_a_fresh_process(base_run):
    """Step 4 was rescored with the state of step 3, the final adapter of the 3-step run
    (model version 1): loaded from the registry in a new interpreter with
    ``PeftModel.from_pretrained``, it gives the decision's recorded ℓ_θ."""
    cfg, out = base_run
    index = RunIndex(open_store(cfg.store.root), out.run_id)
    if 4 not in index.steps():
        pytest.skip("needs the 4-step extension of test_extending_to_four_steps_...")
    io_ = core.StepStore(index.store)
    decisions = io_.get_table(index.lookup(4, "decisions"))
    rescored = io_.get_table(index.lookup(4, "rescored"))
    row = int(decisions["legal"].map(len).idxmax())  # a decision among the most actions
    query = {k: decisions[k].iloc[row] for k in ("prompt", "action", "legal")}
    uri = resolve_tracking(cfg.tracking, cfg.store)[0]
    model_uri = f"models:/{registered_model_name(cfg)}/1"
    argv = [uri, model_uri, cfg.store.root, out.run_id, json.dumps(query)]
    done = subprocess.run(
        [sys.executable, "-c", FRESH_SCORE, *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logp, folder = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(os.listdir(folder)) == sorted(ADAPTER_FILES)
    recorded = float(rescored["logp_theta"].iloc[row])
    assert logp == pytest.approx(recorded, abs=1e-5)
    assert recorded != pytest.approx(float(rescored["logp_rho"].iloc[row]), abs=1e-5)  # θ ≠ ρ


FRESH_SCORE = r"""
import json, sys
import mlflow
from evosteer_core.infra.artifacts import open_store
from evosteer_core.infra.runs import run_config
from evosteer_core.policy.adapter_export import load_adapter_policy
from evosteer_core.policy.orchestrator import Orchestrator

uri, model_uri, root, run_id, query = sys.argv[1:]
mlflow.set_tracking_uri(uri)
folder = mlflow.artifacts.download_artifacts(model_uri)
cfg = run_config(open_store(root), run_id)
policy = Orchestrator(load_adapter_policy(folder, cfg.policy, cfg.train.seed))
q = json.loads(query)
logp = policy.score([q["prompt"]], [q["action"]], [q["legal"]], use_adapter=True)
print(json.dumps([float(logp[0]), folder]))
"""


def _artifact_files(client, run_id, path):
    """Every file under ``path`` of the run's artifacts (recursively)."""
    for item in client.list_artifacts(run_id, path):
        yield from _artifact_files(client, run_id, item.path) if item.is_dir else [item.path]


def _artifact_path(client, run_id, path):
    """The local file of a run's artifact (the default store: a file:// artifact root)."""
    root = client.get_run(run_id).info.artifact_uri
    assert root.startswith("file://")
    return Path(root.removeprefix("file://")) / path


def test_cli_train_contract_and_report(base_run, flyte_env, capsys, tmp_path):
    """`evosteer train` over the finished run: all cached, summary, run id on the last line."""
    cfg, out = base_run
    calls = count_stage_calls(flyte_env)
    sets = [arg for k, v in SMALL.items() for arg in ("--set", f"{k}={v}")]
    argv = ["train", "--steps", "4", "--run-dir", cfg.store.root, *sets]
    assert cli_main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == out.run_id
    assert not calls  # every stage task was a cache hit
    text = "\n".join(lines)
    assert f"Artifact root:  {cfg.store.root}" in text
    assert "mlflow ui --backend-store-uri sqlite:///" in text and "MLflow run:" in text

    report = tmp_path / "report.html"
    argv = ["report", "--run-dir", cfg.store.root, "--run", out.run_id, "--out", str(report)]
    assert cli_main(argv) == 0
    page = report.read_text()
    assert page.count("data:image/svg+xml;base64,") == 4
    assert "SIMULATED" in page and "Learning curve" in page and "Alpha spent" in page
    assert f"/runs/{out.mlflow_run}'" in page  # the link to the run's MLflow page (record_init)


def test_evaluate_checkpoint_table_and_mlflow(base_run, capsys):
    """checkpoint × six sim families × 2 runs → means ± std, iid group, stored and logged, and
    set as tags on the model version registered for that checkpoint."""
    cfg, out = base_run
    argv = [
        "evaluate",
        "--run-dir",
        cfg.store.root,
        "--run",
        out.run_id,
        "--step",
        "3",
        "--runs",
        "2",
    ]
    assert cli_main(argv) == 0
    text = capsys.readouterr().out
    assert "iid avg" in text and "hotpotqa" in text
    runs = MlflowClient(tracking_uri=resolve_tracking(cfg.tracking, cfg.store)[0]).search_runs(
        [_mlflow(cfg).get_run(out.mlflow_run).info.experiment_id],
        filter_string="tags.`evosteer.workflow` = 'evaluate'",
    )
    assert len(runs) == 1
    metrics = runs[0].data.metrics
    assert {"eval.hotpotqa.mean", "eval.hotpotqa.std", "eval.iid_avg.mean"} <= set(metrics)
    assert 0.0 <= metrics["eval.iid_avg.mean"] <= 1.0
    state3 = RunIndex(open_store(cfg.store.root), out.run_id).lookup(3, "state")
    assert runs[0].data.tags["sha256.checkpoint"] == state3.sha256
    # the checkpoint is the registered final adapter of the 3-step run: its results are tags
    version = _mlflow(cfg).get_model_version(registered_model_name(cfg), 1)
    assert version.tags[STATE_TAG] == state3.sha256
    assert float(version.tags["eval.iid_avg.mean"]) == metrics["eval.iid_avg.mean"]


def test_crash_during_step_three_then_resume_is_bit_identical(base_run, tmp_path, capsys):
    cfg, uninterrupted = base_run
    crashed = small_config(tmp_path / "crashed")  # another store: nothing cached for it yet
    original = core.update_stage

    def crash_at_step_three(s, rollouts, *args, **kwargs):
        if int(rollouts.trajectories["step"].iloc[0]) == 3:
            raise RuntimeError("injected failure in the update stage at step 3")
        return original(s, rollouts, *args, **kwargs)

    sets = [arg for k, v in SMALL.items() for arg in ("--set", f"{k}={v}")]
    argv = ["train", "--steps", "3", "--run-dir", crashed.store.root, *sets]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core, "update_stage", crash_at_step_three)
        assert cli_main(argv) == 1
    assert "injected failure" in capsys.readouterr().err
    index = RunIndex(open_store(crashed.store.root), run_id_for(crashed))
    assert index.steps() == [0, 1, 2]  # step 3 never recorded
    client = _mlflow(crashed)
    (failed,) = client.search_runs(
        [client.get_experiment_by_name(crashed.tracking.experiment).experiment_id],
        filter_string=f"tags.`evosteer.run_id` = '{run_id_for(crashed)}'",
    )
    # before: the run stayed RUNNING until the next train marked it KILLED
    assert failed.info.status == "FAILED"
    assert "injected failure in the update stage" in failed.data.tags[END_REASON_TAG]

    with pytest.MonkeyPatch.context() as mp:
        calls = count_stage_calls(mp)
        resumed = train(config_yaml=crashed.to_yaml(), steps=3)
    # steps 1-2 and step 3's rollout/rescore come from the cache; the rest of step 3 runs
    assert [k for k in calls if k[0] == "rollout_stage"] == []
    assert calls[("update_stage", None)] == 1 and calls[("checkpoint_stage", 3)] == 1
    assert resumed.state.sha256 == uninterrupted.state.sha256
    assert resumed.mlflow_run == failed.info.run_id  # the resume continued the failed run
    run = client.get_run(resumed.mlflow_run)
    assert run.info.status == "FINISHED" and run.data.tags[RESUMED_FROM_TAG] == "FAILED"
    assert sorted(m.step for m in client.get_metric_history(resumed.mlflow_run, "loss")) == [
        1,
        2,
        3,
    ]
    for k in (1, 2, 3):
        a = RunIndex(open_store(cfg.store.root), uninterrupted.run_id).step_artifacts(k)
        b = index.step_artifacts(k)
        assert {n: r.sha256 for n, r in a.items()} == {n: r.sha256 for n, r in b.items()}


def test_replay_identical_then_tampered_artifact_is_named(base_run, tmp_path, capsys):
    cfg, out = base_run
    args = ["replay", "--run-dir", cfg.store.root, "--run", out.run_id, "--step", "2"]
    assert cli_main(args) == 0
    text = capsys.readouterr().out
    for name in STEP_ARTIFACTS:
        assert f"{name}: identical" in text
    assert "every artifact identical" in text

    copy = tmp_path / "tampered"
    shutil.copytree(cfg.store.root, copy)
    ref = RunIndex(open_store(str(copy)), out.run_id).lookup(2, "value")
    target = copy / object_key(ref.sha256)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    assert cli_main(["replay", "--run-dir", str(copy), "--run", out.run_id, "--step", "2"]) == 1
    text = capsys.readouterr().out
    assert "value: DIFFERS" in text and "corrupt" in text
    assert "differing artifacts: value" in text.splitlines()[-1]
    for name in set(STEP_ARTIFACTS) - {"value"}:
        assert f"{name}: identical" in text


def test_replay_names_a_deleted_object_as_missing(base_run, tmp_path, capsys):
    """A recorded object deleted from the store: replay still recomputes the step, exits 1 and
    names that artifact as missing with its object, the others identical."""
    cfg, out = base_run
    copy = tmp_path / "deleted"
    shutil.copytree(cfg.store.root, copy)
    ref = RunIndex(open_store(str(copy)), out.run_id).lookup(2, "update")
    (copy / object_key(ref.sha256)).unlink()
    assert cli_main(["replay", "--run-dir", str(copy), "--run", out.run_id, "--step", "2"]) == 1
    text = capsys.readouterr().out
    assert f"update: DIFFERS — stored object missing: artifact {ref.uri} not found" in text
    assert "differing artifacts: update" in text.splitlines()[-1]
    for name in set(STEP_ARTIFACTS) - {"update"}:
        assert f"{name}: identical" in text


def test_a_pair_of_rollout_tables_is_validated_once_a_process(base_run, monkeypatch):
    """Each later stage of a step reads its rollouts: the pandera checks run for the first read
    of a (trajectories, decisions) pair only; an invalid pair raises at every read."""
    from evosteer_core.infra.memo import BoundedMemo

    cfg, out = base_run
    store = open_store(cfg.store.root)
    refs = RunIndex(store, out.run_id).step_artifacts(2)
    io_ = core.StepStore(store)
    monkeypatch.setattr(core, "VALIDATED_ROLLOUTS", BoundedMemo(8))
    calls = []

    def check(traj, dec):
        calls.append(len(traj))

    for _ in range(3):
        traj, dec = io_.get_rollouts(refs["trajectories"], refs["decisions"], check)
    assert calls == [len(traj)] and len(dec) > 0

    def reject(traj, dec):
        calls.append(-1)
        raise ValueError("bad row")

    for _ in range(2):
        with pytest.raises(ValueError, match="bad row"):
            io_.get_rollouts(refs["trajectories"], refs["decisions"], reject)
    assert calls[1:] == [-1, -1]  # another check of the same pair runs; a failure is not kept
