"""Content-addressed artifact store (sha256) over a local folder or S3, and the run index.

Objects live at ``<root>/objects/<aa>/<sha256>`` (``aa`` = first two hex digits). They are
written once and never change; every read re-hashes and raises :class:`CorruptArtifactError`
on a mismatch. Small mutable entries (the run index) live under ``<root>/index/``: each entry is
one object written atomically, so concurrent tasks never lose each other's updates.

A storage or OS failure (unreachable endpoint, missing bucket, bad credentials, read-only root,
full disk) surfaces as :class:`StoreError`: one line naming the store root, the operation and
the cause, instead of a bare ``OSError`` or botocore error without either.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlsplit

from evosteer_core.infra.redact import redact_text, redact_url

CHUNK = 1 << 20
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def canonical_json(obj: Any) -> bytes:
    """UTF-8 JSON with sorted keys and no whitespace: equal values give equal bytes."""
    text = json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


@dataclass(frozen=True)
class ArtifactRef:
    """A pointer to one stored object: where it was written and the sha256 of its bytes."""

    uri: str
    sha256: str

    def __post_init__(self) -> None:
        if not _SHA_RE.match(self.sha256):
            raise ValueError(
                f"ArtifactRef.sha256 must be 64 lowercase hex digits, got {self.sha256!r}"
            )


class CorruptArtifactError(RuntimeError):
    """Stored bytes do not hash to the reference's sha256."""

    def __init__(self, uri: str, expected: str, actual: str) -> None:
        self.uri, self.expected, self.actual = uri, expected, actual
        super().__init__(f"corrupt artifact {uri}: expected sha256 {expected}, found {actual}")


class MissingArtifactError(LookupError):
    """No object (or run-index entry) exists at the expected location."""


_CREDENTIAL_CODES = frozenset(
    {
        "AccessDenied",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "403",
    }
)


def describe_storage_error(exc: BaseException) -> str:
    """One line for an OS or S3 failure: the errno name (``ENOSPC``) or the S3 error code, and
    the endpoint's host only (no path, query or credentials of the request URL)."""
    from botocore.exceptions import ClientError, EndpointConnectionError

    if isinstance(exc, OSError) and exc.errno in errno.errorcode:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or os.strerror(exc.errno)} ({errno.errorcode[exc.errno]}){where}"
    if isinstance(exc, EndpointConnectionError):
        url = urlsplit(str(exc.kwargs.get("endpoint_url", "")))
        host = f"{url.scheme}://{url.hostname}" + (f":{url.port}" if url.port else "")
        return f"cannot connect to the S3 endpoint {host}"
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "?"))
        text = f"{code}: {error.get('Message') or 'no message'}"
        if code in _CREDENTIAL_CODES:
            text += " (check the S3 credentials, e.g. AWS_ACCESS_KEY_ID)"
        return text
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no message"
    return f"{type(exc).__name__}: {redact_text(first[:300])}"


_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ETIMEDOUT",
        "ECONNRESET",
        "ECONNREFUSED",
        "ECONNABORTED",
        "EHOSTUNREACH",
        "ENETUNREACH",
        "ENETDOWN",
        "EPIPE",
        "EAGAIN",
        "EINTR",
        "EIO",
        "ESTALE",
    )
    if hasattr(errno, name)
)
"""OS errors of a network or a shared file system that pass: timeouts, lost connections,
I/O errors, stale NFS handles. A full disk, a read-only root or a denied permission stay."""

_TRANSIENT_S3_CODES = frozenset(
    {
        "500",
        "502",
        "503",
        "504",
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
    }
)
"""S3 error codes of a service that is overloaded or failing, not of a wrong request."""


def is_transient_storage_error(exc: BaseException) -> bool:
    """True for an infrastructure failure worth retrying: a timeout or lost connection (OS or
    botocore), or an S3 server-side/throttling code. False for what the config or the
    environment gets wrong: a missing bucket, bad credentials, a denied or read-only path, a
    full disk."""
    from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, BotoConnectionError | HTTPClientError | IncompleteReadError):
        return True  # endpoint unreachable, connect/read timeouts, closed connections
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "")) in _TRANSIENT_S3_CODES
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


class StoreError(OSError):
    """A storage or OS failure of one store operation, in one line: the store root, the
    operation and the cause. An ``OSError`` so callers that catch those still do."""

    what = "store"

    def __init__(self, root: str, operation: str, cause: BaseException) -> None:
        self.root, self.operation, self.cause = root, operation, cause
        where = redact_url(root)
        self.line = f"{self.what} {where}: {operation} failed: {describe_storage_error(cause)}"
        super().__init__(self.line)
        self.errno = getattr(cause, "errno", None)

    def __str__(self) -> str:
        # flytekit prefixes ``args`` when a task fails locally; keep ``str`` the one line.
        return self.line

    @property
    def transient(self) -> bool:
        """Whether the cause is an infrastructure failure that a later attempt may not meet
        (:func:`is_transient_storage_error`); a store the config gets wrong is not."""
        return is_transient_storage_error(self.cause)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.root, self.operation, self.cause))

    @classmethod
    @contextlib.contextmanager
    def wrapping(
        cls, root: str, operation: str, errors: tuple[type[BaseException], ...]
    ) -> Iterator[None]:
        """Re-raise ``errors`` (storage/OS failures) raised inside as this class, naming the
        root and the operation; an error already wrapped passes through unchanged."""
        try:
            yield
        except StoreError:
            raise
        except errors as exc:
            raise cls(root, operation, exc) from exc


def object_key(sha256: str) -> str:
    """Store-relative key of the object with this hash."""
    return f"objects/{sha256[:2]}/{sha256}"


def _hash_stream(stream: BinaryIO, sink: BinaryIO | None = None) -> str:
    h = hashlib.sha256()
    while chunk := stream.read(CHUNK):
        h.update(chunk)
        if sink is not None:
            sink.write(chunk)
    return h.hexdigest()


class ArtifactStore(Protocol):
    """What every backend provides: immutable objects by hash plus small named entries."""

    root: str

    def put_bytes(self, data: bytes, name_hint: str = "") -> ArtifactRef: ...

    def get_bytes(self, ref: ArtifactRef) -> bytes: ...

    def exists(self, ref: ArtifactRef) -> bool: ...

    def put_file(self, path: str | Path, name_hint: str = "") -> ArtifactRef: ...

    def get_file(self, ref: ArtifactRef, dest: str | Path) -> Path: ...

    def name_hint(self, ref: ArtifactRef) -> str | None: ...

    def write_entry(self, key: str, data: bytes) -> None: ...

    def create_entry(self, key: str, data: bytes) -> bool:
        """Write the entry only if it does not exist, atomically against other writers;
        whether this call wrote it."""
        ...

    def read_entry(self, key: str) -> bytes: ...

    def list_entries(self, prefix: str) -> list[str]: ...


def put_json(store: ArtifactStore, obj: Any, name_hint: str = "") -> ArtifactRef:
    """Store ``obj`` as canonical JSON (equal values get equal refs)."""
    return store.put_bytes(canonical_json(obj), name_hint)


def get_json(store: ArtifactStore, ref: ArtifactRef) -> Any:
    """Read a verified JSON object."""
    return json.loads(store.get_bytes(ref))


# --- local folder -------------------------------------------------------------------------


@contextlib.contextmanager
def _atomic_target(final: Path, exclusive: bool = False) -> Iterator[BinaryIO]:
    """Write to a temp file beside ``final``, fsync, then rename; on error nothing appears.
    ``exclusive``: publish by a hard link instead, which fails with ``FileExistsError`` (and
    leaves the existing file as it was) when ``final`` exists."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if exclusive:
            os.link(tmp, final)
            os.unlink(tmp)
        else:
            os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(final.parent)


def _verified_bytes(ref: ArtifactRef, data: bytes) -> bytes:
    """``data`` if its SHA-256 is the one ``ref`` names, else ``CorruptArtifactError``."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != ref.sha256:
        raise CorruptArtifactError(ref.uri, ref.sha256, actual)
    return data


def _verified_copy(ref: ArtifactRef, stream: BinaryIO, dest: Path) -> Path:
    """Copy ``stream`` to ``dest`` atomically; a content that does not hash to ``ref`` raises
    ``CorruptArtifactError`` and leaves ``dest`` untouched."""
    with _atomic_target(dest) as sink:
        actual = _hash_stream(stream, sink)
        if actual != ref.sha256:
            raise CorruptArtifactError(ref.uri, ref.sha256, actual)
    return dest


def _fsync_dir(path: Path) -> None:
    """Persist a rename: fsync the directory that holds the new name."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class LocalStore:
    """Artifact store in a local folder; writes are atomic (temp file + fsync + rename)."""

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root).expanduser().resolve()
        self.root = str(self.path)

    def _object_path(self, sha256: str) -> Path:
        return self.path / object_key(sha256)

    def _ref(self, sha256: str) -> ArtifactRef:
        return ArtifactRef(self._object_path(sha256).as_uri(), sha256)

    def _op(self, operation: str) -> contextlib.AbstractContextManager[None]:
        return StoreError.wrapping(self.root, operation, (OSError,))

    def _write_hint(self, sha256: str, name_hint: str) -> None:
        hint = self._object_path(sha256).with_suffix(".name")
        if name_hint and not hint.exists():
            with _atomic_target(hint) as fh:
                fh.write(name_hint.encode("utf-8"))

    def put_bytes(self, data: bytes, name_hint: str = "") -> ArtifactRef:
        sha = hashlib.sha256(data).hexdigest()
        final = self._object_path(sha)
        with self._op(f"write object {sha[:12]}"):
            if not final.exists():
                with _atomic_target(final) as fh:
                    fh.write(data)
            self._write_hint(sha, name_hint)
        return self._ref(sha)

    def put_file(self, path: str | Path, name_hint: str = "") -> ArtifactRef:
        with self._op(f"write object from {path}"):
            return self._put_file(path, name_hint)

    def _put_file(self, path: str | Path, name_hint: str) -> ArtifactRef:
        objects = self.path / "objects"
        objects.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=objects, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as sink, open(path, "rb") as src:
                sha = _hash_stream(src, sink)
                sink.flush()
                os.fsync(sink.fileno())
            final = self._object_path(sha)
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                os.unlink(tmp)
            else:
                os.replace(tmp, final)
                _fsync_dir(final.parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._write_hint(sha, name_hint or Path(path).name)
        return self._ref(sha)

    def _open(self, ref: ArtifactRef) -> BinaryIO:
        try:
            return open(self._object_path(ref.sha256), "rb")
        except FileNotFoundError:
            raise MissingArtifactError(f"artifact {ref.uri} not found in {self.root}") from None

    def get_bytes(self, ref: ArtifactRef) -> bytes:
        with self._op(f"read object {ref.sha256[:12]}"), self._open(ref) as fh:
            return _verified_bytes(ref, fh.read())

    def get_file(self, ref: ArtifactRef, dest: str | Path) -> Path:
        with self._op(f"copy object {ref.sha256[:12]} to {dest}"), self._open(ref) as src:
            return _verified_copy(ref, src, Path(dest))

    def exists(self, ref: ArtifactRef) -> bool:
        with self._op(f"look up object {ref.sha256[:12]}"):
            return self._object_path(ref.sha256).is_file()

    def name_hint(self, ref: ArtifactRef) -> str | None:
        hint = self._object_path(ref.sha256).with_suffix(".name")
        with self._op(f"read the name of object {ref.sha256[:12]}"):
            return hint.read_text(encoding="utf-8") if hint.exists() else None

    def write_entry(self, key: str, data: bytes) -> None:
        with self._op(f"write entry {key}"), _atomic_target(self.path / key) as fh:
            fh.write(data)

    def create_entry(self, key: str, data: bytes) -> bool:
        with self._op(f"create entry {key}"):
            try:
                with _atomic_target(self.path / key, exclusive=True) as fh:
                    fh.write(data)
            except FileExistsError:
                return False
        return True

    def read_entry(self, key: str) -> bytes:
        with self._op(f"read entry {key}"):
            try:
                return (self.path / key).read_bytes()
            except FileNotFoundError:
                raise MissingArtifactError(f"no entry {key} in {self.root}") from None

    def list_entries(self, prefix: str) -> list[str]:
        """Every entry under ``prefix`` (``os.walk``: ~20x faster than ``Path.rglob`` over the
        ~1,700 index entries of a 240-step run, which the CLI and record tasks list)."""
        base = self.path / prefix
        cut = len(str(self.path).rstrip(os.sep)) + 1
        with self._op(f"list {prefix}"):
            if not base.is_dir():
                return []
            return sorted(
                f"{folder[cut:].replace(os.sep, '/')}/{name}"
                for folder, _, files in os.walk(base)
                for name in files
                if not name.startswith(".tmp-")
            )


# --- S3 -----------------------------------------------------------------------------------


def s3_endpoint_from_env() -> str | None:
    """The S3 endpoint from the environment (AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


class S3Store:
    """Artifact store under ``s3://bucket/prefix``; one PUT per object is atomic on S3."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None) -> None:
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or s3_endpoint_from_env()
        self.root = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = boto3.client("s3", endpoint_url=self.endpoint_url)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _ref(self, sha256: str) -> ArtifactRef:
        return ArtifactRef(f"s3://{self.bucket}/{self._key(object_key(sha256))}", sha256)

    def _op(self, operation: str) -> contextlib.AbstractContextManager[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        return StoreError.wrapping(self.root, operation, (BotoCoreError, ClientError, OSError))

    def _head(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    @staticmethod
    def _metadata(name_hint: str) -> dict[str, str]:
        # S3 user metadata must be ASCII; keep a readable, escaped form.
        return (
            {"name-hint": name_hint.encode("ascii", "backslashreplace").decode()}
            if name_hint
            else {}
        )

    def put_bytes(self, data: bytes, name_hint: str = "") -> ArtifactRef:
        sha = hashlib.sha256(data).hexdigest()
        key = self._key(object_key(sha))
        with self._op(f"write object {sha[:12]}"):
            if self._head(key) is None:
                self.client.put_object(
                    Bucket=self.bucket, Key=key, Body=data, Metadata=self._metadata(name_hint)
                )
        return self._ref(sha)

    def put_file(self, path: str | Path, name_hint: str = "") -> ArtifactRef:
        with self._op(f"write object from {path}"):
            with open(path, "rb") as fh:
                sha = _hash_stream(fh)
            key = self._key(object_key(sha))
            if self._head(key) is None:
                meta = self._metadata(name_hint or Path(path).name)
                self.client.upload_file(str(path), self.bucket, key, ExtraArgs={"Metadata": meta})
        return self._ref(sha)

    def _get_body(self, key: str, what: str):
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise MissingArtifactError(f"{what} not found in {self.root}") from None
            raise

    def _object_body(self, ref: ArtifactRef):
        return self._get_body(self._key(object_key(ref.sha256)), f"artifact {ref.uri}")

    def get_bytes(self, ref: ArtifactRef) -> bytes:
        with self._op(f"read object {ref.sha256[:12]}"):
            return _verified_bytes(ref, self._object_body(ref).read())

    def get_file(self, ref: ArtifactRef, dest: str | Path) -> Path:
        with self._op(f"copy object {ref.sha256[:12]} to {dest}"):
            return _verified_copy(ref, self._object_body(ref), Path(dest))

    def exists(self, ref: ArtifactRef) -> bool:
        with self._op(f"look up object {ref.sha256[:12]}"):
            return self._head(self._key(object_key(ref.sha256))) is not None

    def name_hint(self, ref: ArtifactRef) -> str | None:
        with self._op(f"read the name of object {ref.sha256[:12]}"):
            head = self._head(self._key(object_key(ref.sha256)))
        return None if head is None else head.get("Metadata", {}).get("name-hint")

    def write_entry(self, key: str, data: bytes) -> None:
        with self._op(f"write entry {key}"):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def create_entry(self, key: str, data: bytes) -> bool:
        """A conditional PUT (``If-None-Match: *``): S3 refuses it (412) when the key exists;
        a 409 (another conditional PUT of the key in flight) is a store error like any."""
        from botocore.exceptions import ClientError

        with self._op(f"create entry {key}"):
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                )
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") == "PreconditionFailed":
                    return False
                raise
        return True

    def read_entry(self, key: str) -> bytes:
        with self._op(f"read entry {key}"):
            return self._get_body(self._key(key), f"entry {key}").read()

    def list_entries(self, prefix: str) -> list[str]:
        full = self._key(prefix.rstrip("/") + "/")
        cut = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        with self._op(f"list {prefix}"):
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            ):
                keys.extend(obj["Key"][cut:] for obj in page.get("Contents", []))
        return sorted(keys)


SUPPORTED_SCHEMES = ("s3", "file")
"""URL schemes a store root may have; a root without one is a local path."""

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def unsupported_scheme(root: str) -> str | None:
    """Why ``root`` names no store we serve (its URL scheme has no backend), or None. Without
    the check ``gs://b`` would silently become the local folder ``./gs:/b``."""
    match = _SCHEME_RE.match(root)
    if match is None or match.group(1).lower() in SUPPORTED_SCHEMES:
        return None
    return (
        f"the scheme {match.group(1)!r} is not supported; use a local path, file://PATH or "
        "s3://BUCKET/PREFIX (for another object store, its S3-compatible endpoint in "
        "store.s3_endpoint)"
    )


def open_store(root: str, endpoint: str | None = None) -> ArtifactStore:
    """``s3://bucket/prefix`` -> S3Store; a path or file:// URI -> LocalStore; any other
    scheme is refused in one line (:func:`unsupported_scheme`)."""
    if (why := unsupported_scheme(root)) is not None:
        raise ValueError(f"store root {redact_url(root)!r}: {why}")
    if root.startswith("s3://"):
        bucket, _, prefix = root[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"store root {root!r} has no bucket name")
        return S3Store(bucket, prefix, endpoint)
    if root.startswith("file://"):
        root = root[len("file://") :]
    return LocalStore(root)


# --- store identity -----------------------------------------------------------------------

STORE_ID_ENTRY = "store.json"
"""The entry holding a store's identity, written once when the store is first used."""


def store_id(store: ArtifactStore) -> str:
    """The store's identity: a random id written into the store the first time it is asked
    for, then read back.

    It names the store, not where it is reached: a moved or copied folder, or a bucket reached
    through another endpoint, keeps its id (and its objects); another folder or bucket has its
    own. Cache keys hold it (``evosteer_flyte.tasks.spec.RunSpec``), so a cached ref can only
    come back in a store that was written under the same id.
    """
    try:
        return _read_store_id(store)
    except MissingArtifactError:
        pass
    store.create_entry(STORE_ID_ENTRY, canonical_json({"store_id": uuid.uuid4().hex}))
    return _read_store_id(store)  # first writers race: only one creates it, all read that one


def _read_store_id(store: ArtifactStore) -> str:
    data = json.loads(store.read_entry(STORE_ID_ENTRY))
    if not isinstance(data, dict) or not isinstance(data.get("store_id"), str):
        raise ValueError(f'{store.root}/{STORE_ID_ENTRY}: expected {{"store_id": TEXT}}')
    return data["store_id"]


def missing_refs(store: ArtifactStore, refs: dict[str, ArtifactRef]) -> list[str]:
    """The names in ``refs`` whose objects are not in ``store`` (in the given order)."""
    return [name for name, ref in refs.items() if not store.exists(ref)]


# --- run index ----------------------------------------------------------------------------


class RunIndexConflictError(RuntimeError):
    """A (run, step, name) entry already points at different content."""


class RunIndex:
    """(run_id, step, artifact name) -> ArtifactRef, one JSON entry per artifact in the store.

    Entry key: ``index/<run_id>/steps/<step:06d>/<name>.json``. Each entry is written in one
    atomic operation and never read-modified-written, so tasks of the same step may record
    concurrently. Re-recording the same ref is a no-op; a different ref needs ``replace=True``.
    """

    def __init__(self, store: ArtifactStore, run_id: str) -> None:
        _check_name(run_id, "run_id")
        self.store = store
        self.run_id = run_id

    def _step_prefix(self, step: int) -> str:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return f"index/{self.run_id}/steps/{step:06d}"

    def record(self, step: int, name: str, ref: ArtifactRef, replace: bool = False) -> None:
        _check_name(name, "artifact name")
        key = f"{self._step_prefix(step)}/{name}.json"
        if not replace:
            try:
                old = self.lookup(step, name)
            except MissingArtifactError:
                old = None
            if old is not None and old.sha256 != ref.sha256:
                raise RunIndexConflictError(
                    f"run {self.run_id} step {step} artifact {name!r} already recorded as "
                    f"{old.sha256}, refusing {ref.sha256} (pass replace=True to overwrite)"
                )
            if old == ref:
                return
        self.store.write_entry(key, canonical_json({"uri": ref.uri, "sha256": ref.sha256}))

    def lookup(self, step: int, name: str) -> ArtifactRef:
        key = f"{self._step_prefix(step)}/{name}.json"
        try:
            data = json.loads(self.store.read_entry(key))
        except MissingArtifactError:
            raise MissingArtifactError(
                f"run {self.run_id} has no artifact {name!r} at step {step} in {self.store.root}"
            ) from None
        return ArtifactRef(uri=data["uri"], sha256=data["sha256"])

    def step_artifacts(self, step: int) -> dict[str, ArtifactRef]:
        """Every artifact recorded for ``step``, by name."""
        prefix = self._step_prefix(step)
        names = [k[len(prefix) + 1 : -len(".json")] for k in self.store.list_entries(prefix)]
        return {n: self.lookup(step, n) for n in names}

    def steps(self) -> list[int]:
        """The steps that have at least one recorded artifact, ascending."""
        prefix = f"index/{self.run_id}/steps"
        found = {
            int(k[len(prefix) + 1 :].split("/", 1)[0]) for k in self.store.list_entries(prefix)
        }
        return sorted(found)


def _check_name(name: str, what: str) -> None:
    if not _NAME_RE.match(name):
        raise ValueError(
            f"{what} {name!r} must be 1-128 characters of letters, digits, '.', '_' or '-' "
            "and start with a letter or digit"
        )
