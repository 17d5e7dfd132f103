"""kill -9 at every task boundary of a step, then resume: the same final state and artifacts.

A chain of real `evosteer train` processes of one 2-step run (one store root, one flytekit
local cache): each is SIGKILLed by itself on entering the next task of step 2, i.e. right after
the previous task finished and was cached; the next process resumes and is killed one task
later, and the last one finishes. Its final state and every step artifact must be the bytes of
an uninterrupted run of the same config in another store root; a train over an object deleted
afterwards names it in one line. The same uninterrupted run is the reference of a 2-step S3 run
whose S3 server is frozen (SIGSTOP) for a few seconds and then resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from conftest import FAKE_AWS_ENV, moto_server_process
from pipeline_support import SMALL, isolate_flyte_cache, small_config

from evosteer_core.infra.artifacts import ArtifactStore, RunIndex, object_key, open_store
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.runs import run_id_for
from evosteer_core.pipeline import stage_io
from evosteer_flyte.cli import main as cli_main
from evosteer_flyte.workflows.train import train

REPO = Path(__file__).resolve().parents[1]
SETS = [arg for k, v in SMALL.items() for arg in ("--set", f"{k}={v}")]

BOUNDARIES = ("rollout", "rescore", "value", "update", "validation", "checkpoint", "record")
"""Step 2's tasks in workflow order, by what each enters first: ``stage_io.run_stage`` of its
stage for each stage task, and ``RunIndex.record`` for ``record_step`` (before it records
anything)."""

KILLING_TRAINS = r"""
import json, os, signal, sys
from evosteer_core.pipeline import stage_io
from evosteer_core.infra.artifacts import RunIndex
from evosteer_flyte.cli import main  # the slow imports, once: every train is forked after them

out_dir, kill_points, argv = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]

def boundary(name_of, original, step_of, log, kill_at):
    def entered(*args, **kwargs):
        name, step = name_of(args), step_of(args)
        with open(log, "a") as f:
            f.write(f"{name} {step}\n")
        if name == kill_at and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)
    return entered

def train(i, kill_at):
    log = os.path.join(out_dir, f"{i}.log")
    stage_io.run_stage = boundary(lambda a: a[2], stage_io.run_stage, lambda a: a[4], log, kill_at)
    RunIndex.record = boundary(lambda a: "record", RunIndex.record, lambda a: a[1], log, kill_at)
    with open(os.path.join(out_dir, f"{i}.out"), "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    os._exit(main(argv))

codes = []
for i, kill_at in enumerate(kill_points):
    pid = os.fork()
    if pid == 0:
        train(i, kill_at)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""
"""Run ``evosteer train ARGV`` once per kill point, one after another, each in a process forked
after the imports: it logs every task boundary it enters (``name step``, to ``I.log``; its
output goes to ``I.out``) and SIGKILLs itself on entering its kill point in step 2 (``-``:
never). Prints the exit codes (``-9``: killed by SIGKILL)."""


def _step_two_entered(log: Path) -> list[str]:
    """The distinct step-2 boundaries a process entered, in order."""
    names = [ln.split()[0] for ln in log.read_text().splitlines() if ln.split()[1] == "2"]
    return list(dict.fromkeys(names))


@pytest.fixture(scope="module")
def flyte_home(tmp_path_factory) -> Iterator[Path]:
    """One isolated flytekit local cache for the module (in-process runs and subprocesses)."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        isolate_flyte_cache(mp, home)
        yield home


@pytest.fixture(scope="module")
def uninterrupted(flyte_home, tmp_path_factory) -> tuple[RunConfig, dict[int, dict[str, str]]]:
    """An uninterrupted 2-step run (local store): its config and each step's artifact hashes."""
    cfg = small_config(tmp_path_factory.mktemp("uninterrupted"))
    out = train(config_yaml=cfg.to_yaml(), steps=2)
    return cfg, _artifact_hashes(open_store(cfg.store.root), out.run_id)


def _artifact_hashes(store: ArtifactStore, run_id: str) -> dict[int, dict[str, str]]:
    """{step: {artifact: sha256}} of steps 1 and 2 as the run index records them."""
    index = RunIndex(store, run_id)
    assert index.steps() == [0, 1, 2]
    return {k: {n: r.sha256 for n, r in index.step_artifacts(k).items()} for k in (1, 2)}


def test_kill_9_at_every_task_boundary_of_a_step_then_resume_is_bit_identical(
    uninterrupted, flyte_home, tmp_path, capsys
):
    _, expected = uninterrupted
    home = flyte_home

    root = tmp_path / "killed"
    chain = tmp_path / "chain"
    chain.mkdir()
    kill_points = [*BOUNDARIES, "-"]
    argv = ["train", "--steps", "2", "--run-dir", str(root), *SETS]
    done = subprocess.run(
        [sys.executable, "-c", KILLING_TRAINS, str(chain), ",".join(kill_points), *argv],
        cwd=REPO,
        env={**os.environ, "HOME": str(home)},  # the same flytekit local cache for every train
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.splitlines()[-1])
    outs = [(chain / f"{i}.out").read_text()[-2000:] for i in range(len(kill_points))]
    # each train was really killed by SIGKILL at its boundary; the run lock it held did not
    # stop the next one, which resumed and ran only the task its predecessor was killed before
    assert codes == [-signal.SIGKILL] * len(BOUNDARIES) + [0], outs
    for i in range(len(BOUNDARIES)):
        assert _step_two_entered(chain / f"{i}.log") == list(BOUNDARIES[max(i - 1, 0) : i + 1])
    # the last train found all of step 2 cached but the record its predecessor did not finish
    last = len(BOUNDARIES)
    assert _step_two_entered(chain / f"{last}.log") == ["record"]

    cfg = small_config(root)
    final = (chain / f"{last}.out").read_text()
    assert final.strip().splitlines()[-1] == run_id_for(cfg)
    assert f"Final state:    {expected[2]['state']}" in final
    assert _artifact_hashes(open_store(str(root)), run_id_for(cfg)) == expected

    # a cached object deleted from the store: the next train names it and the cure in one line
    ref = RunIndex(open_store(str(root)), run_id_for(cfg)).lookup(2, "update")
    (root / object_key(ref.sha256)).unlink()
    assert cli_main(argv) == 1
    (line,) = [
        ln
        for ln in capsys.readouterr().err.replace("\r", "\n").splitlines()
        if ln.startswith("evosteer")
    ]
    assert line.startswith("evosteer train: StaleCacheError in task ") and "record_step" in line
    assert f"step 2: 'update' ({ref.sha256[:12]}) not in the store {root}: " in line
    assert "pyflyte local-cache clear" in line


STALL_S = 4.0
"""How long the S3 server stays stopped (below botocore's 60 s read timeout: no retry)."""


def _process_state(pid: int) -> str:
    """The one-letter state of a process (``T``: stopped), from ``/proc``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _wait_stopped(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether the process reaches state ``T`` within the timeout: SIGSTOP is delivered
    asynchronously, so a busy process can still read ``R`` just after ``kill`` returns."""
    deadline = time.monotonic() + timeout_s
    while _process_state(pid) != "T":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_s3_stall_then_recovery_is_bit_identical(uninterrupted, tmp_path, monkeypatch):
    """The S3 server is frozen (SIGSTOP) for a few seconds as step 2's rescore task starts
    reading its inputs, then resumed (SIGCONT): the waiting requests complete, the run finishes
    and its artifacts are the bytes of the uninterrupted run's. Valid across stores: no
    artifact embeds the store root (the kill test's local runs compare across roots too)."""
    _, expected = uninterrupted
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    with moto_server_process() as (endpoint, server):
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="stall")
        cfg = small_config(
            "s3://stall/runs",
            **{
                "store.s3_endpoint": endpoint,
                "tracking.tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                "tracking.artifact_location": "s3://stall/mlartifacts",
            },
        )
        original = stage_io.run_stage
        stalled: list[float] = []

        def stall_then_rescore(cfg, io_, name, state, step, *args):
            if (name, step) != ("rescore", 2):
                return original(cfg, io_, name, state, step, *args)
            os.kill(server.pid, signal.SIGSTOP)
            assert _wait_stopped(server.pid)  # really stopped
            threading.Timer(STALL_S, os.kill, (server.pid, signal.SIGCONT)).start()
            started = time.monotonic()
            try:
                return original(cfg, io_, name, state, step, *args)  # its first read waits
            finally:
                stalled.append(time.monotonic() - started)

        monkeypatch.setattr(stage_io, "run_stage", stall_then_rescore)
        try:
            out = train(config_yaml=cfg.to_yaml(), steps=2)
        finally:
            os.kill(server.pid, signal.SIGCONT)  # whatever happened, let the server stop
        assert stalled and stalled[0] >= STALL_S  # the task did wait for the frozen server
        assert out.state.sha256 == expected[2]["state"]
        assert _artifact_hashes(open_store(cfg.store.root, endpoint), out.run_id) == expected
