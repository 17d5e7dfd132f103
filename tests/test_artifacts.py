"""Content-addressed artifact store (local folder and S3 on moto_server) and the run index."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from evosteer_core.infra import artifacts
from evosteer_core.infra.artifacts import (
    ArtifactRef,
    CorruptArtifactError,
    LocalStore,
    MissingArtifactError,
    RunIndex,
    RunIndexConflictError,
    S3Store,
    canonical_json,
    get_json,
    open_store,
    put_json,
)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/some/prefix", endpoint=endpoint)


def test_round_trip_and_content_addressing(store) -> None:
    data = b"adapter weights \x00\x01"
    ref = store.put_bytes(data, "adapter.safetensors")
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.uri.endswith(f"objects/{ref.sha256[:2]}/{ref.sha256}")
    assert store.get_bytes(ref) == data
    assert store.exists(ref)
    assert store.put_bytes(data, "other-name") == ref  # identical content, same ref
    assert store.name_hint(ref) == "adapter.safetensors"  # first hint is kept
    other = store.put_bytes(b"something else")
    assert other != ref and store.name_hint(other) is None


def test_json_is_canonical(store) -> None:
    a = put_json(store, {"b": [1, 2.5], "a": "é"})
    b = put_json(store, {"a": "é", "b": [1, 2.5]})
    assert a == b
    assert get_json(store, a) == {"a": "é", "b": [1, 2.5]}
    assert canonical_json({"b": 1, "a": [1, "x"]}) == b'{"a":[1,"x"],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_file_round_trip(store, tmp_path: Path) -> None:
    src = tmp_path / "heads.pt"
    payload = os.urandom(3 * artifacts.CHUNK + 17)  # several streaming chunks
    src.write_bytes(payload)
    ref = store.put_file(src)
    assert ref.sha256 == hashlib.sha256(payload).hexdigest()
    assert store.name_hint(ref) == "heads.pt"
    dest = store.get_file(ref, tmp_path / "out" / "copy.pt")
    assert dest.read_bytes() == payload
    assert store.put_bytes(payload) == ref


def test_missing_object(store) -> None:
    ref = ArtifactRef("file:///nowhere", "0" * 64)
    assert not store.exists(ref)
    with pytest.raises(MissingArtifactError):
        store.get_bytes(ref)


def test_ref_validates_hash() -> None:
    with pytest.raises(ValueError, match="64 lowercase hex"):
        ArtifactRef("file:///x", "abc")


def test_local_corruption_is_detected(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    ref = store.put_bytes(b"original bytes")
    path = tmp_path / "objects" / ref.sha256[:2] / ref.sha256
    path.write_bytes(b"tampered bytes")
    with pytest.raises(CorruptArtifactError) as err:
        store.get_bytes(ref)
    tampered = hashlib.sha256(b"tampered bytes").hexdigest()
    assert err.value.expected == ref.sha256 and err.value.actual == tampered
    assert ref.uri in str(err.value) and tampered in str(err.value)
    dest = tmp_path / "dest.bin"
    with pytest.raises(CorruptArtifactError):
        store.get_file(ref, dest)
    assert not dest.exists()  # a failed verified download leaves nothing behind


def test_s3_corruption_is_detected(moto_endpoint: str, s3_bucket: str) -> None:
    store = S3Store(s3_bucket, "p", endpoint_url=moto_endpoint)
    ref = store.put_bytes(b"original bytes")
    store.client.put_object(
        Bucket=s3_bucket, Key=f"p/objects/{ref.sha256[:2]}/{ref.sha256}", Body=b"x"
    )
    with pytest.raises(CorruptArtifactError, match=ref.sha256):
        store.get_bytes(ref)


def test_s3_endpoint_from_environment(
    moto_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    store = open_store(f"s3://{s3_bucket}")
    assert isinstance(store, S3Store) and store.endpoint_url == moto_endpoint
    ref = store.put_bytes(b"abc")
    assert ref.uri == f"s3://{s3_bucket}/objects/{ref.sha256[:2]}/{ref.sha256}"
    assert store.get_bytes(ref) == b"abc"


def test_open_store_dispatch(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert open_store(tmp_path.as_uri()).root == str(tmp_path.resolve())
    with pytest.raises(ValueError, match="no bucket"):
        open_store("s3:///prefix")


class CrashingWriter:
    """A file-like sink that fails after writing part of the data (a crash mid-write)."""

    def __init__(self, real) -> None:
        self.real = real

    def write(self, data: bytes) -> int:
        self.real.write(data[: len(data) // 2])
        raise OSError("simulated crash mid-write")

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def __enter__(self) -> CrashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.close()


def test_crash_mid_write_leaves_no_visible_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path)
    real_fdopen = os.fdopen
    monkeypatch.setattr(
        artifacts.os, "fdopen", lambda *a, **k: CrashingWriter(real_fdopen(*a, **k))
    )
    data = b"x" * 10_000
    with pytest.raises(OSError, match="simulated crash"):
        store.put_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    final = tmp_path / "objects" / sha[:2] / sha
    assert not final.exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # temp file cleaned up
    monkeypatch.undo()
    ref = store.put_bytes(data)  # a retry succeeds and the object is whole
    assert store.get_bytes(ref) == data


def test_run_index(store) -> None:
    index = RunIndex(store, "run-1")
    r1 = store.put_bytes(b"rollout step 3")
    r2 = store.put_bytes(b"adapter step 3")
    r3 = store.put_bytes(b"adapter step 10")
    index.record(3, "rollouts", r1)
    index.record(3, "adapter", r2)
    index.record(10, "adapter", r3)
    index.record(3, "rollouts", r1)  # idempotent
    assert index.lookup(3, "adapter") == r2
    assert index.step_artifacts(3) == {"adapter": r2, "rollouts": r1}
    assert index.steps() == [3, 10]
    assert RunIndex(store, "run-2").steps() == []
    with pytest.raises(RunIndexConflictError, match="replace=True"):
        index.record(3, "adapter", r3)
    index.record(3, "adapter", r3, replace=True)
    assert index.lookup(3, "adapter") == r3
    with pytest.raises(MissingArtifactError, match="run-1 has no artifact 'heads' at step 3"):
        index.lookup(3, "heads")
    with pytest.raises(ValueError, match="run_id"):
        RunIndex(store, "../escape")
    with pytest.raises(ValueError, match="artifact name"):
        index.record(1, "a/b", r1)


def test_create_entry_writes_only_a_missing_entry(store) -> None:
    """The first create writes; a second (or one after write_entry) changes nothing."""
    assert store.create_entry("ids/store.json", b"first") is True
    assert store.create_entry("ids/store.json", b"second") is False
    assert store.read_entry("ids/store.json") == b"first"
    store.write_entry("ids/other.json", b"written")
    assert store.create_entry("ids/other.json", b"created") is False
    assert store.read_entry("ids/other.json") == b"written"
    assert store.list_entries("ids") == ["ids/other.json", "ids/store.json"]


def test_list_entries_lists_every_entry_below_a_prefix(store) -> None:
    """Nested entries, sorted, as store-relative keys; a sibling folder whose name extends the
    prefix is not under it; a local store leaves out its temporary files."""
    keys = ["usage/r/000002/value.json", "usage/r/000001/rollout.json", "usage/r/000001/a.json"]
    for key in [*keys, "usage/r2/000001/x.json", "index/r/steps/000001/state.json"]:
        store.write_entry(key, b"{}")
    assert store.list_entries("usage/r") == sorted(keys)
    assert store.list_entries("usage/r/000001") == sorted(keys[1:])
    assert store.list_entries("usage/none") == []
    if isinstance(store, LocalStore):
        (store.path / "usage/r/000001/.tmp-123").write_bytes(b"partial")
        walked = sorted(
            p.relative_to(store.path).as_posix()
            for p in (store.path / "usage/r").rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")
        )
        assert store.list_entries("usage/r") == walked == sorted(keys)


def test_a_store_at_the_filesystem_root_lists_relative_keys(tmp_path: Path) -> None:
    root = LocalStore("/")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b.json").write_bytes(b"{}")
    prefix = tmp_path.relative_to("/").as_posix()
    assert root.list_entries(prefix) == [f"{prefix}/a/b.json"]


def test_local_run_index_writes_are_atomic(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    ref = store.put_bytes(b"x")
    RunIndex(store, "r").record(0, "adapter", ref)
    entry = tmp_path / "index" / "r" / "steps" / "000000" / "adapter.json"
    assert entry.read_bytes() == canonical_json({"sha256": ref.sha256, "uri": ref.uri})
    leftovers = [p.name for p in tmp_path.rglob(".tmp-*")]
    assert leftovers == []
