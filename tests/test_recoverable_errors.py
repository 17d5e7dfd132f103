"""Which failures Flyte retries (issue 16 item 3): infrastructure failures (a store that times
out or drops the connection, S3 throttling or 5xx, an executor outage) leave a task as
``FlyteRecoverableException``; a store the config gets wrong (no bucket), a bad config and bad
data leave it as themselves, which Flyte does not retry. Each class is raised through a real
task (or the train workflow) here."""

from __future__ import annotations

import errno
import os
import signal
import time

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from conftest import FAKE_AWS_ENV, moto_server_process
from flytekit.exceptions.user import FlyteRecoverableException
from pipeline_support import isolate_flyte_cache

from evosteer_core.benchmarks.rows import BenchmarkDataError
from evosteer_core.infra.artifacts import StoreError, is_transient_storage_error, open_store
from evosteer_core.infra.config import load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_flyte.tasks.spec import RunSpec, make_spec
from evosteer_flyte.tasks.tracking_tasks import record_init
from evosteer_flyte.workflows.train import train

STATE = "0" * 64


def _client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}}, "GetObject")


@pytest.mark.parametrize(
    ("cause", "transient"),
    [
        (TimeoutError("timed out"), True),
        (OSError(errno.ECONNRESET, "reset"), True),
        (OSError(errno.EIO, "I/O error"), True),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), True),
        (_client_error("SlowDown"), True),
        (_client_error("503"), True),
        (_client_error("InternalError"), True),
        (_client_error("NoSuchBucket"), False),
        (_client_error("AccessDenied"), False),
        (OSError(errno.ENOSPC, "full"), False),
        (OSError(errno.EROFS, "read-only"), False),
        (OSError(errno.EACCES, "denied"), False),
    ],
)
def test_transient_storage_errors_are_the_infrastructure_ones(cause, transient):
    assert is_transient_storage_error(cause) is transient
    assert StoreError("s3://b/p", "read entry x", cause).transient is transient


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server with one bucket, and S3 clients that give up after 1 s and 1 attempt
    (so a stalled server is a read timeout in a second, not in a minute)."""
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    real_client = boto3.client
    quick = Config(connect_timeout=1, read_timeout=1, retries={"max_attempts": 1})
    monkeypatch.setattr(boto3, "client", lambda *a, **kw: real_client(*a, config=quick, **kw))
    with moto_server_process() as (url, proc):
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket="runs-bucket")
        yield url, proc


def _stopped(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "T":
                return True
        time.sleep(0.01)
    return False


def test_a_store_timeout_is_recoverable_through_a_task(s3, tmp_path, monkeypatch):
    """The S3 server is frozen mid-run: the task's first store read times out, and the task
    fails as Flyte's recoverable error whose cause is the store timeout (before: a plain
    StoreError, which Flyte fails at once without a retry)."""
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    url, proc = s3
    cfg = load_config(None, {"store.root": "s3://runs-bucket/exp", "store.s3_endpoint": url})
    spec = make_spec(cfg)
    state = open_store(cfg.store.root, url).put_bytes(b"state")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        assert _stopped(proc.pid)
        with pytest.raises(FlyteRecoverableException) as info:
            record_init(spec=spec, config_yaml=cfg.to_yaml(), state=state)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    cause = info.value.__cause__
    assert isinstance(cause, StoreError) and cause.transient
    assert "store s3://runs-bucket/exp: read entry store.json failed" in str(info.value)
    assert record_init(spec=spec, config_yaml=cfg.to_yaml(), state=state) == state  # retried


def test_a_wrong_store_a_bad_config_and_bad_data_are_not_recoverable(s3, tmp_path, monkeypatch):
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    url, _ = s3
    cfg = load_config(None, {"store.root": "s3://no-such-bucket/exp", "store.s3_endpoint": url})
    from evosteer_core.infra.runs import config_hash

    spec = RunSpec("r", config_hash(cfg), cfg.train.seed, store_id="x")
    state = open_store("s3://runs-bucket/exp", url).put_bytes(b"state")
    with pytest.raises(StoreError, match="NoSuchBucket") as info:
        record_init(spec=spec, config_yaml=cfg.to_yaml(), state=state)
    assert not isinstance(info.value, FlyteRecoverableException)

    with pytest.raises(ConfigError, match="no_such_key") as info:
        record_init(spec=spec, config_yaml=cfg.to_yaml() + "no_such_key: 1\n", state=state)
    assert not isinstance(info.value, FlyteRecoverableException)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": ["a"]}\n{"question": "", "answer": ["b"]}\n')
    data = load_config(
        None,
        {
            "store.root": str(tmp_path / "runs"),
            "data.source": "benchmarks",
            "data.train": [{"name": "nq_open", "path": str(bad)}],
        },
    )
    with pytest.raises(BenchmarkDataError, match="bad.jsonl:2") as info:
        train(config_yaml=data.to_yaml(), steps=1)
    assert not isinstance(info.value, FlyteRecoverableException)
