"""Shared fixtures: a real S3-compatible server (moto_server) on 127.0.0.1 for the session, and
torch's thread count restored after every test module."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module", autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """Put torch's intra-op thread count back after each module: float reductions, and so the
    bytes of a run's artifacts, depend on it, so a module that sets it must not change what a
    later module computes in-process (e.g. a reference run compared with subprocess runs)."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _moto_server_exe() -> str:
    beside = Path(sys.executable).with_name("moto_server")
    found = str(beside) if beside.exists() else shutil.which("moto_server")
    if found is None:
        pytest.fail("moto_server not found: install the dev extra (moto[server])")
    return found


@contextlib.contextmanager
def moto_server(extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """Run a moto S3 server on 127.0.0.1 (``extra_env`` configures it, e.g. turns on its
    credential checks) and yield its URL; stopped on exit."""
    with moto_server_process(extra_env) as (url, _):
        yield url


@contextlib.contextmanager
def moto_server_process(
    extra_env: dict[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`moto_server`, also yielding its process (a test can stall it with SIGSTOP)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [_moto_server_exe(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(extra_env or {})},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # it answered: the server is up
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not start on {url} (exit code {proc.poll()})")
                time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of a moto S3 server started for this session (fake credentials set in the env)."""
    saved = {k: os.environ.get(k) for k in FAKE_AWS_ENV}
    os.environ.update(FAKE_AWS_ENV)
    try:
        with moto_server() as url:
            yield url
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A fresh, empty bucket on the session's moto server."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=name)
    return name
