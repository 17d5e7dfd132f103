"""MLflow tracking of a training run: config params, per-step metrics and artifacts, tags.

One MLflow run per workflow execution. Per-step artifacts go under ``step_{k:04d}/``.
The client is explicit (``MlflowClient``), never the global "active run", so Flyte tasks in
one process can attach to the same run by id. Telemetry is disabled before MLflow loads.

MLflow's SQLite store migrates its schema when a process first opens it, and creating an
experiment is get-then-create: neither is safe from two processes at once (a half-migrated
``mlflow.db``, ``Experiment ... already exists``). Both run under a file lock beside the database
(``<db>.lock``); against a server, a lost creation race re-reads the experiment instead.

A storage failure of MLflow (full disk, unreachable artifact store or server, broken database)
is re-raised as :class:`TrackingError`: one line naming the tracking URI and the operation.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore, StoreError, canonical_json
from evosteer_core.infra.configio import ConfigError, flatten
from evosteer_core.infra.locks import file_lock
from evosteer_core.infra.redact import redact_url, redact_urls
from evosteer_core.infra.runs import config_hash

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from evosteer_core.infra.config import RunConfig, StoreConfig, TrackingConfig

PARAM_BATCH = 100  # MLflow's limit of params per log_batch call
PARAM_MAX_CHARS = 6000  # MLflow's limit on one param value
EXECUTION_TAG = "flyte.execution_id"
CONFIG_HASH_TAG = "evosteer.config_hash"


class TrackingError(StoreError):
    """MLflow could not store or read what a tracking operation needed (one line)."""

    what = "MLflow tracking"


def _tracking_errors() -> tuple[type[BaseException], ...]:
    """What a failing MLflow backend raises: OS errors of local artifacts, MLflow's own (REST,
    SQL store), S3 artifact errors and raw SQLAlchemy errors."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    return (OSError, MlflowException, BotoCoreError, ClientError, Boto3Error, SQLAlchemyError)


def _tracking_op(tracking_uri: str, operation: str) -> contextlib.AbstractContextManager[None]:
    return TrackingError.wrapping(redact_url(tracking_uri), operation, _tracking_errors())


def step_dir(step: int) -> str:
    """Artifact folder of one training step inside the MLflow run."""
    return f"step_{step:04d}"


def resolve_tracking(tracking: TrackingConfig, store: StoreConfig) -> tuple[str, str]:
    """(tracking URI, experiment artifact location) with defaults derived from the store.

    Local store: ``sqlite:///<root>/mlflow.db`` and ``<root>/mlartifacts``. An S3 store needs an
    explicit ``tracking.tracking_uri`` (a SQL database or an MLflow server) and defaults
    artifacts to ``<root>/mlartifacts`` in the bucket.
    """
    if store.root.startswith("s3://"):
        if tracking.tracking_uri is None:
            raise ConfigError(
                "<config>",
                "tracking.tracking_uri",
                f"required when store.root is on S3 ({store.root}); e.g. an MLflow server URL",
            )
        return (
            tracking.tracking_uri,
            tracking.artifact_location or f"{store.root.rstrip('/')}/mlartifacts",
        )
    root = Path(store.root.removeprefix("file://")).expanduser().resolve()
    uri = tracking.tracking_uri or f"sqlite:///{root / 'mlflow.db'}"
    return uri, tracking.artifact_location or (root / "mlartifacts").as_uri()


def _sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (without its query), else None."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri[len("sqlite:///") :].partition("?")[0])


def _setup_lock(tracking_uri: str) -> contextlib.AbstractContextManager[object]:
    """The lock that serializes schema migration and experiment creation of a SQLite store
    across processes (a no-op for other backends)."""
    db = _sqlite_file(tracking_uri)
    if db is None:
        return contextlib.nullcontext()
    return file_lock(db.with_name(db.name + ".lock"))


def _client(tracking_uri: str, s3_endpoint: str | None) -> MlflowClient:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if s3_endpoint:
        # MLflow's S3 artifact repository reads its endpoint from the environment only.
        os.environ["MLFLOW_S3_ENDPOINT_URL"] = s3_endpoint
    db = _sqlite_file(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    from mlflow import MlflowClient

    with _setup_lock(tracking_uri):
        return MlflowClient(tracking_uri=tracking_uri)  # opens (and migrates) the store


def _experiment_id(
    client: MlflowClient, tracking_uri: str, name: str, artifact_location: str | None
) -> str:
    """Get or create the experiment ``name``; safe when other processes do the same."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

    with _setup_lock(tracking_uri):
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException as exc:
            if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
        exp = client.get_experiment_by_name(name)  # another process created it meanwhile
        if exp is None:
            raise RuntimeError(f"MLflow experiment {name!r} exists but cannot be read back")
        return exp.experiment_id


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else canonical_json(value).decode("utf-8")
    return text if len(text) <= PARAM_MAX_CHARS else text[: PARAM_MAX_CHARS - 3] + "..."


def end_unfinished_runs(
    config: RunConfig, tags: Mapping[str, str], status: str = "KILLED"
) -> list[str]:
    """Mark the RUNNING runs of the config's experiment that carry all of ``tags`` as
    ``status``; their ids. A train calls it before it opens its own run: under the CLI's run
    lock no other process is training that run id, so such runs belong to a process that died
    (``kill -9``, a crash) and at most one run per run id is RUNNING at a time."""
    uri, _ = resolve_tracking(config.tracking, config.store)
    with _tracking_op(uri, "close unfinished runs"):
        client = _client(uri, config.store.s3_endpoint)
        exp = client.get_experiment_by_name(config.tracking.experiment)
        if exp is None:
            return []
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in sorted(tags.items()))
        stale = client.search_runs(
            [exp.experiment_id], filter_string=f"{query} and attributes.status = 'RUNNING'"
        )
        for run in stale:
            client.set_terminated(run.info.run_id, status=status)
    return [run.info.run_id for run in stale]


class RunTracker:
    """Logs one training run to MLflow. Create with :meth:`start` or :meth:`attach`."""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    @classmethod
    def start(
        cls,
        tracking_uri: str,
        experiment: str,
        run_name: str,
        config: RunConfig | Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        artifact_location: str | None = None,
        s3_endpoint: str | None = None,
    ) -> RunTracker:
        """Create a run (and the experiment if new); log the config as flattened params and
        as ``config.yaml``, and tag its hash when it is a RunConfig."""
        all_tags = dict(tags or {})
        if config is not None and not isinstance(config, Mapping):
            all_tags[CONFIG_HASH_TAG] = config_hash(config)
        with _tracking_op(tracking_uri, f"start a run in experiment {experiment}"):
            client = _client(tracking_uri, s3_endpoint)
            exp_id = _experiment_id(client, tracking_uri, experiment, artifact_location)
            run = client.create_run(exp_id, tags=all_tags, run_name=run_name)
        tracker = cls(client, run.info.run_id)
        if config is not None:
            tracker.log_config(config)
        return tracker

    @classmethod
    def from_config(
        cls, config: RunConfig, run_name: str | None = None, tags: Mapping[str, str] | None = None
    ) -> RunTracker:
        """Start a run where ``config.tracking`` (and the store) say."""
        uri, location = resolve_tracking(config.tracking, config.store)
        return cls.start(
            uri,
            config.tracking.experiment,
            run_name or config.name,
            config,
            tags,
            location,
            config.store.s3_endpoint,
        )

    @classmethod
    def attach(cls, tracking_uri: str, run_id: str, s3_endpoint: str | None = None) -> RunTracker:
        """Resume logging to an existing run (e.g. after a crash, or from another task)."""
        with _tracking_op(tracking_uri, f"attach to run {run_id}"):
            client = _client(tracking_uri, s3_endpoint)
            run = client.get_run(run_id)  # raises if the run does not exist
            if run.info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
        return cls(client, run_id)

    def _op(self, operation: str) -> contextlib.AbstractContextManager[None]:
        return _tracking_op(self.client.tracking_uri, f"{operation} of run {self.run_id}")

    def log_config(self, config: RunConfig | Mapping[str, Any]) -> None:
        """Config as flattened dotted params plus the full ``config.yaml`` artifact, with
        credentials redacted from its URLs."""
        from mlflow.entities import Param

        plain = redact_urls(config.to_dict() if hasattr(config, "to_dict") else dict(config))
        params = [Param(k, _param_value(v)) for k, v in sorted(flatten(plain).items())]
        text = yaml.safe_dump(plain, sort_keys=False)
        with self._op("log the config"):
            for i in range(0, len(params), PARAM_BATCH):
                self.client.log_batch(self.run_id, params=params[i : i + PARAM_BATCH])
            self.client.log_text(self.run_id, text, "config.yaml")

    def log_step(self, step: int, metrics: Mapping[str, float | int | bool]) -> None:
        """Per-step scalars under any names (booleans become 0/1)."""
        from mlflow.entities import Metric

        bad = {k: v for k, v in metrics.items() if not isinstance(v, int | float)}
        if bad:
            raise TypeError(f"metrics must be numbers; step {step} got {bad!r}")
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in sorted(metrics.items())]
        if batch:
            with self._op(f"log the metrics of step {step}"):
                self.client.log_batch(self.run_id, metrics=batch)

    def log_step_artifacts(self, step: int, files: Mapping[str, str | Path | bytes]) -> None:
        """Files under ``step_{k:04d}/``: name -> local path (copied) or bytes (written)."""
        with (
            self._op(f"log the artifacts of step {step}"),
            tempfile.TemporaryDirectory(prefix="evosteer-mlflow-") as tmp,
        ):
            folder = Path(tmp) / step_dir(step)
            folder.mkdir()
            for name, content in files.items():
                if Path(name).name != name:
                    raise ValueError(f"artifact name {name!r} must be a plain file name")
                target = folder / name
                target.write_bytes(
                    content if isinstance(content, bytes) else Path(content).read_bytes()
                )
            self.client.log_artifacts(self.run_id, str(folder), artifact_path=step_dir(step))

    def log_step_refs(
        self, step: int, store: ArtifactStore, refs: Mapping[str, ArtifactRef], copy: bool = True
    ) -> None:
        """Link store artifacts to the run: ``refs.json`` (+ the verified bytes when ``copy``)
        under the step folder, and a ``sha256.<name>`` tag with the latest hash of each."""
        files: dict[str, str | Path | bytes] = {
            "refs.json": canonical_json(
                {n: {"uri": r.uri, "sha256": r.sha256} for n, r in refs.items()}
            )
        }
        if copy:
            files.update({name: store.get_bytes(ref) for name, ref in refs.items()})
        self.log_step_artifacts(step, files)
        self.set_tags({f"sha256.{name}": ref.sha256 for name, ref in refs.items()})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set run tags (e.g. ``flyte.execution_id``)."""
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        with self._op("set tags"):
            for i in range(0, len(items), PARAM_BATCH):
                self.client.log_batch(self.run_id, tags=items[i : i + PARAM_BATCH])

    def end(self, status: str = "FINISHED") -> None:
        """Mark the run FINISHED, FAILED or KILLED."""
        with self._op(f"end ({status})"):
            self.client.set_terminated(self.run_id, status=status)
