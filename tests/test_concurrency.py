"""Concurrent use of one run dir: MLflow's SQLite setup from several processes at once, two
`evosteer train` processes of the same run started together (one trains, the other refuses in
one line; one MLflow run per run id, never two RUNNING), and the dir usable afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlflow import MlflowClient
from pipeline_support import SMALL, isolate_flyte_cache, small_config

from evosteer_core.infra.artifacts import RunIndex, open_store
from evosteer_core.infra.locks import run_lock
from evosteer_core.infra.runs import run_id_for
from evosteer_core.infra.tracking import (
    END_REASON_TAG,
    EXECUTIONS_TAG,
    RUN_ID_TAG,
    resolve_tracking,
)
from evosteer_flyte.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
SETS = [arg for k, v in SMALL.items() for arg in ("--set", f"{k}={v}")]

START_TRACKING = r"""
import pathlib, sys, time
import mlflow.store.tracking.sqlalchemy_store  # the slow imports, before the start signal
from evosteer_core.infra.tracking import RunTracker
uri, ready, go = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.005)
print(RunTracker.start(uri, "shared-experiment", "run").run_id)
"""


def test_concurrent_tracking_setup_on_a_fresh_database(tmp_path):
    """Three processes open a fresh ``mlflow.db`` and create the same experiment at one instant:
    all succeed (one migration, one experiment, three runs)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", START_TRACKING, uri, str(tmp_path / f"ready{i}"), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(3)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    go.touch()  # every process has imported MLflow: release them together
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("shared-experiment")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(out.strip() for out, _ in outs)


def _train(root: Path, home: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "evosteer_flyte.cli", "train", "--steps", "1"]
        + ["--run-dir", str(root), *SETS],
        cwd=REPO,
        env={**os.environ, "HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("evosteer train:")]


def _runs_of(cfg, run_id: str):
    client = MlflowClient(tracking_uri=resolve_tracking(cfg.tracking, cfg.store)[0])
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    assert exp is not None
    return client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'"
    )


def test_two_trains_at_once_then_a_third(tmp_path, monkeypatch, capsys):
    """Two real `evosteer train` processes of one run on a fresh dir: each either finishes or
    refuses in one line; the run has one MLflow run, which a successful second train continues;
    a third train afterwards (in-process, same flytekit cache) works, continues it, and closes a
    run a killed train left RUNNING."""
    root = tmp_path / "run"
    cfg = small_config(root)
    run_id = run_id_for(cfg)
    home = tmp_path / "home"
    procs = [_train(root, home), _train(root, home)]
    outs = [p.communicate(timeout=600) for p in procs]
    codes = [p.returncode for p in procs]
    assert 0 in codes, [err[-3000:] for _, err in outs]
    for code, (out, err) in zip(codes, outs, strict=True):
        if code == 0:
            assert out.strip().splitlines()[-1] == run_id
        else:
            assert code == 1 and "Traceback" not in err, err[-3000:]
            (line,) = _error_lines(err)
            assert line.startswith(f"evosteer train: run {run_id} in {root} is already being")
            assert "trained by pid " in line

    # one MLflow run per training run: a train after a finished one continues it, a refused
    # train opened nothing and wrote no execution into it
    (run,) = _runs_of(cfg, run_id)
    assert run.info.status == "FINISHED"
    assert len(run.data.tags[EXECUTIONS_TAG].split()) == codes.count(0)

    # A train killed with -9 leaves its MLflow run RUNNING: the next train marks it KILLED.
    client = MlflowClient(tracking_uri=resolve_tracking(cfg.tracking, cfg.store)[0])
    tags = {RUN_ID_TAG: run_id, "evosteer.workflow": "train"}
    orphan = client.create_run(run.info.experiment_id, tags=tags).info.run_id
    isolate_flyte_cache(monkeypatch, home)
    capsys.readouterr()
    assert cli_main(["train", "--steps", "1", "--run-dir", str(root), *SETS]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == run_id
    assert client.get_run(orphan).info.status == "KILLED"
    after = _runs_of(cfg, run_id)
    assert {r.info.run_id for r in after} == {run.info.run_id, orphan}
    assert [r.info.status for r in after].count("RUNNING") == 0
    continued = client.get_run(run.info.run_id).data.tags[EXECUTIONS_TAG]
    assert len(continued.split()) == codes.count(0) + 1


def test_train_of_a_run_in_training_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    """While the run's lock is held, `evosteer train` of that run exits 1 at once naming the
    holder, and leaves no MLflow run and no step behind."""
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    root = tmp_path / "run"
    cfg = small_config(root)
    run_id = run_id_for(cfg)
    with run_lock(str(root), run_id):
        started = time.monotonic()
        code = cli_main(["train", "--steps", "1", "--run-dir", str(root), *SETS])
        elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 1 and elapsed < 30
    (line,) = _error_lines(err)
    assert f"run {run_id} in {root} is already being trained by pid {os.getpid()} on " in line
    assert not (root / "mlflow.db").exists() and not (root / "index").exists()


def test_a_train_refused_just_after_the_holder_locked_still_names_it(tmp_path):
    """The holder takes the lock, then writes its line: a train refused in between waits for
    the line instead of naming "another process" (the two-trains test saw this race)."""
    import fcntl
    import threading

    import pytest

    from evosteer_core.infra.locks import RunInUseError, run_lock_path

    path = run_lock_path(str(tmp_path), "r1")
    path.parent.mkdir(parents=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # locked, no line yet
    threading.Timer(0.3, os.pwrite, (fd, b"pid 4242 on host since now", 0)).start()
    try:
        with (
            pytest.raises(RunInUseError, match="trained by pid 4242 on host"),
            run_lock(str(tmp_path), "r1"),
        ):
            pass
    finally:
        os.close(fd)


def test_sigterm_of_a_train_ends_its_mlflow_run_killed(tmp_path):
    """Before: a train stopped with SIGTERM (``kill``, a scheduler) died at once and left its
    MLflow run RUNNING. Now the CLI turns SIGTERM into an exit, the run ends KILLED with the
    reason, and the process exits 143."""
    root = tmp_path / "run"
    cfg = small_config(root)
    run_id = run_id_for(cfg)
    proc = _train(root, tmp_path / "home")
    deadline = time.monotonic() + 300
    # step 0 is recorded after start_tracking opened the run (and migrated the database, which
    # this process must not touch meanwhile)
    while not _recorded(root, run_id):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.5)
    assert [r.info.status for r in _runs_of(cfg, run_id)] == ["RUNNING"]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    (run,) = _runs_of(cfg, run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags[END_REASON_TAG].startswith("SystemExit")


def _recorded(root: Path, run_id: str) -> bool:
    try:
        return 0 in RunIndex(open_store(str(root)), run_id).steps()
    except Exception:  # the store is still being created by the train
        return False
