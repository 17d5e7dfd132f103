"""Storage faults under `evosteer train`: a killed S3 endpoint, a missing bucket, bad
credentials, a read-only store root and a full disk each end the command with one line on
stderr naming the store root and the operation (no traceback), and the progress poller never
raises whatever its listing does."""

from __future__ import annotations

import errno
import os
import pickle
import threading
from pathlib import Path

import pytest
from conftest import FAKE_AWS_ENV, _free_port, moto_server
from pipeline_support import SMALL, isolate_flyte_cache

from evosteer_core.infra import artifacts
from evosteer_core.infra.artifacts import LocalStore, RunIndex, S3Store, StoreError
from evosteer_flyte.cli import main as cli_main
from evosteer_flyte.console import StepProgress


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys):
    """Run ``evosteer train`` in-process on the smallest config; returns (exit code, the
    ``evosteer train:`` lines of stderr, all of stderr)."""
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # a dead endpoint fails at once, not after retries
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    sets = [arg for k, v in SMALL.items() for arg in ("--set", f"{k}={v}")]

    def run(run_dir: str, *extra: str) -> tuple[int, list[str], str]:
        capsys.readouterr()
        code = cli_main(["train", "--steps", "1", "--run-dir", run_dir, *sets, *extra])
        err = capsys.readouterr().err
        lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("evosteer ")]
        return code, lines, err

    return run


def _s3_args(endpoint: str, tmp_path: Path) -> list[str]:
    return [
        "--set",
        f"store.s3_endpoint={endpoint}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
    ]


def _assert_one_clear_line(result, *parts: str) -> None:
    code, lines, err = result
    assert code == 1
    assert len(lines) == 1, err
    for part in parts:
        assert part in lines[0], lines[0]
    assert "Traceback" not in err


def test_killed_s3_endpoint_is_one_line(cli, tmp_path):
    port = _free_port()  # nothing listens there: the S3 server is down
    result = cli("s3://runs-bucket/exp", *_s3_args(f"http://127.0.0.1:{port}", tmp_path))
    _assert_one_clear_line(
        result,
        "evosteer train: store s3://runs-bucket/exp: list index/",
        f"cannot connect to the S3 endpoint http://127.0.0.1:{port}",
    )
    assert "list-type=2" not in result[2]  # the request URL is not the message


def test_missing_bucket_is_one_line(cli, moto_endpoint, tmp_path):
    result = cli("s3://no-such-bucket/exp", *_s3_args(moto_endpoint, tmp_path))
    _assert_one_clear_line(result, "store s3://no-such-bucket/exp: list index/", "NoSuchBucket")


def test_bad_credentials_are_one_line(cli, moto_endpoint, tmp_path):
    # A second moto server that checks credentials: the fake keys in the env are unknown to it.
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as strict:
        result = cli("s3://some-bucket/exp", *_s3_args(strict, tmp_path))
    _assert_one_clear_line(
        result, "store s3://some-bucket/exp: list index/", "InvalidAccessKeyId", "credentials"
    )


def _refuse_writes_under(monkeypatch, root: Path, err: int) -> None:
    """Make the kernel calls that create files or folders under ``root`` fail with ``err``
    (what a read-only mount answers; portable, and effective even for root)."""
    real_open, real_mkdir = os.open, os.mkdir

    def guarded(real):
        def call(path, *args, **kwargs):
            if Path(path).resolve().is_relative_to(root):
                raise OSError(err, os.strerror(err), str(path))
            return real(path, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "open", guarded(real_open))
    monkeypatch.setattr(os, "mkdir", guarded(real_mkdir))


def test_read_only_store_root_is_one_line(cli, tmp_path, monkeypatch):
    root = tmp_path / "readonly"
    root.mkdir()
    _refuse_writes_under(monkeypatch, root.resolve(), errno.EROFS)
    result = cli(str(root))
    _assert_one_clear_line(
        result, f"store {root}: create the run lock", "Read-only file system (EROFS)"
    )


class _FullDisk:
    """A file object whose writes fail as on a full disk: ``[Errno 28]`` with no file name."""

    def __init__(self, real) -> None:
        self.real = real

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.close()


def _fill_disk_under(monkeypatch, root: Path) -> None:
    """Every file opened by descriptor under ``root`` (the store's temp files) is on a full disk."""
    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        fh = real_fdopen(fd, *args, **kwargs)
        on_root = Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(root)
        return _FullDisk(fh) if on_root else fh

    monkeypatch.setattr(artifacts.os, "fdopen", fdopen)


@pytest.mark.parametrize("tracking", [True, False], ids=["mlflow-first", "store-first"])
def test_full_disk_is_one_line_and_leaves_no_partial_object(cli, tmp_path, monkeypatch, tracking):
    root = (tmp_path / "full").resolve()
    _fill_disk_under(monkeypatch, root)
    result = cli(str(root), "--set", f"tracking.enabled={str(tracking).lower()}")
    # the store's identity (store.json, created when the run spec is made) is the first write,
    # before MLflow's artifacts or any object, with tracking on or off
    first = f"store {root}: create entry store.json "
    _assert_one_clear_line(result, first, "failed: No space left on device (ENOSPC)")
    assert not list(root.rglob(".tmp-*"))  # the failed write left nothing behind


def test_store_wraps_every_operation_with_root_and_operation(tmp_path, monkeypatch):
    store = LocalStore(tmp_path)
    _fill_disk_under(monkeypatch, tmp_path.resolve())
    with pytest.raises(StoreError) as info:
        store.write_entry("index/r/steps/000001/state.json", b"{}")
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert pickle.loads(pickle.dumps(info.value)).line == info.value.line
    assert str(info.value) == (
        f"store {store.root}: write entry index/r/steps/000001/state.json failed: "
        "No space left on device (ENOSPC)"
    )


def test_error_lines_carry_no_credentials():
    cause = RuntimeError("failed GET http://user:hunter2@db.example/x?token=hunter2")
    err = StoreError("postgresql://admin:hunter2@db.example/mlflow", "read entry k", cause)
    assert "hunter2" not in err.line
    assert err.line.startswith("store postgresql://REDACTED@db.example/mlflow: read entry k")


def test_s3_store_errors_name_root_and_operation(moto_endpoint):
    store = S3Store("absent-bucket", "p", moto_endpoint)
    with pytest.raises(StoreError, match=r"^store s3://absent-bucket/p: write object \w+"):
        store.put_bytes(b"payload")
    with pytest.raises(StoreError, match="read entry index/x.json failed: NoSuchBucket"):
        store.read_entry("index/x.json")


def test_progress_poller_never_raises(monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    dead = f"http://127.0.0.1:{_free_port()}"
    index = RunIndex(S3Store("bucket", "runs", dead), "run-1")
    uncaught: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    progress = StepProgress(index, total=3)
    with progress:
        threading.Event().wait(1.5)  # at least one poll from the thread
    assert not uncaught
    postfix = progress.bar.postfix or ""
    assert "progress unavailable: store s3://bucket/runs: list index/run-1/steps" in postfix
    assert progress.bar.n == 0
