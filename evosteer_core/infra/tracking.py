"""MLflow tracking of a training run: config params, per-step metrics and artifacts, tags, and
the registered adapter.

One MLflow run per training run (:func:`open_run`): a resumed or extended train continues the
MLflow run of its run id and logs only the steps that run does not hold yet
(:meth:`RunTracker.log_training_step`). Per-step artifacts go under ``step_{k:04d}/``; the final
adapter of a train is registered as a model version (:meth:`RunTracker.register_adapter`).
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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore, StoreError, canonical_json
from evosteer_core.infra.configio import ConfigError, flatten
from evosteer_core.infra.locks import file_lock
from evosteer_core.infra.provenance import code_tags
from evosteer_core.infra.redact import redact_text, redact_url, redact_urls
from evosteer_core.infra.runs import config_hash

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run
    from mlflow.entities.model_registry import ModelVersion

    from evosteer_core.infra.config import RunConfig, StoreConfig, TrackingConfig

PARAM_BATCH = 100  # MLflow's limit of params per log_batch call
PARAM_MAX_CHARS = 6000  # MLflow's limit on one param value
TAG_MAX_CHARS = 8000  # MLflow's limit on one tag value
EXECUTION_TAG = "flyte.execution_id"
"""The Flyte execution that last wrote to the run."""
EXECUTIONS_TAG = "flyte.execution_ids"
"""Every execution that wrote to the run, oldest first, space-separated (cut from the front at
MLflow's tag limit)."""
CONFIG_HASH_TAG = "evosteer.config_hash"
RUN_ID_TAG = "evosteer.run_id"
WORKFLOW_TAG = "evosteer.workflow"
TRAIN_STEPS_TAG = "evosteer.train_steps"
"""``train.steps`` of the latest execution: a tag, not a param, since an extended run changes it
and MLflow params are immutable."""
LOGGED_STEP_TAG = "evosteer.logged_step"
"""The last step whose metrics and artifacts are fully logged to the run."""
RESUMED_FROM_TAG = "evosteer.resumed_from"
"""The status the run had when the latest execution continued it (FINISHED, FAILED, KILLED)."""
END_REASON_TAG = "evosteer.end_reason"
"""Why the run last ended FAILED or KILLED (one line); kept when a later train continues it."""
STATE_TAG = "evosteer.state_sha256"
"""On a model version: the sha256 of the train state its adapter comes from."""
STEP_TAG = "evosteer.step"
BACKBONE_TAG = "evosteer.backbone"
"""On a model version: ``policy.backbone``, the base the adapter goes onto."""
NOT_PARAMS = ("train.steps",)
"""Config keys logged as tags instead of params (:data:`TRAIN_STEPS_TAG`)."""
ADAPTER_DIR = "adapter"
"""Folder of a step's PEFT adapter inside ``step_{k:04d}/``; a model version's source."""


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


def _tag_query(tags: Mapping[str, str]) -> str:
    return " and ".join(f"tags.`{k}` = '{v}'" for k, v in sorted(tags.items()))


def _search(
    config: RunConfig, tags: Mapping[str, str], operation: str, running_only: bool = False
) -> tuple[MlflowClient, list[Run]]:
    """The client and the active runs of the config's experiment carrying all of ``tags``,
    newest first."""
    uri, _ = resolve_tracking(config.tracking, config.store)
    with _tracking_op(uri, operation):
        client = _client(uri, config.store.s3_endpoint)
        exp = client.get_experiment_by_name(config.tracking.experiment)
        if exp is None:
            return client, []
        query = _tag_query(tags) + (" and attributes.status = 'RUNNING'" if running_only else "")
        runs = client.search_runs(
            [exp.experiment_id], filter_string=query, order_by=["attributes.start_time DESC"]
        )
    return client, list(runs)


def end_unfinished_runs(
    config: RunConfig,
    tags: Mapping[str, str],
    status: str = "KILLED",
    reason: str = "left RUNNING by a process that died; closed by the next start",
) -> list[str]:
    """Mark the RUNNING runs of the config's experiment that carry all of ``tags`` as
    ``status`` (with ``reason`` as :data:`END_REASON_TAG`); their ids. A train calls it before
    it opens its run: under the CLI's run lock no other process is training that run id, so
    such runs belong to a process that died (``kill -9``, a crash); the CLI calls it with
    FAILED or KILLED when its own train fails or is interrupted."""
    client, stale = _search(config, tags, "close unfinished runs", running_only=True)
    uri = client.tracking_uri
    with _tracking_op(uri, "close unfinished runs"):
        for run in stale:
            client.set_tag(run.info.run_id, END_REASON_TAG, _tag_value(reason))
            client.set_terminated(run.info.run_id, status=status)
    return [run.info.run_id for run in stale]


@contextlib.contextmanager
def closing_on_failure(
    config: RunConfig,
    run_id: str,
    workflow: str,
    stopped: Callable[[BaseException], object] | None = None,
) -> Iterator[None]:
    """Around a workflow run by this process under the run lock: if it raises, its MLflow run
    (RUNNING, same run id and workflow) ends FAILED, or KILLED for an interrupt (Ctrl-C,
    SIGTERM as ``SystemExit``) or a deliberate stop (``stopped(exc)`` true: the run budget),
    with the error's one line (URLs redacted) as :data:`END_REASON_TAG`; the error
    is re-raised as it was, also when MLflow itself cannot be reached to close the run."""
    try:
        yield
    except BaseException as exc:
        killed = isinstance(exc, KeyboardInterrupt | SystemExit) or bool(stopped and stopped(exc))
        with contextlib.suppress(Exception):  # the original error is the one to report
            end_failed_run(
                config,
                run_id,
                workflow,
                f"{type(exc).__name__}: {exc}",
                "KILLED" if killed else "FAILED",
            )
        raise


def end_failed_run(
    config: RunConfig, run_id: str, workflow: str, reason: str, status: str = "FAILED"
) -> list[str]:
    """End the RUNNING MLflow run of ``run_id`` and ``workflow`` as ``status`` with ``reason``
    (one line, URLs redacted) as :data:`END_REASON_TAG`; nothing with tracking off. The CLI's
    :func:`closing_on_failure` and a cluster workflow's failure handler both end runs here."""
    if not config.tracking.enabled:
        return []
    line = redact_text(" ".join(reason.split()))
    return end_unfinished_runs(config, {RUN_ID_TAG: run_id, WORKFLOW_TAG: workflow}, status, line)


def _tag_value(text: str) -> str:
    return text if len(text) <= TAG_MAX_CHARS else text[: TAG_MAX_CHARS - 3] + "..."


def _execution_history(previous: str, execution_id: str) -> str:
    """``previous`` with ``execution_id`` appended, the oldest ids dropped past the tag limit."""
    ids = [*previous.split(), execution_id]
    while len(" ".join(ids)) > TAG_MAX_CHARS and len(ids) > 1:
        ids.pop(0)
    return " ".join(ids)


def open_run(
    config: RunConfig, run_id: str, workflow: str, execution_id: str, resume: bool
) -> RunTracker:
    """The MLflow run of one execution of ``workflow`` for ``run_id``.

    Runs of the same run id and workflow left RUNNING are marked KILLED first. With ``resume``
    (a train), the newest run of the same run id, workflow and config hash is continued: set
    back to RUNNING, its status recorded as :data:`RESUMED_FROM_TAG`, new config params added
    and ``config.yaml`` replaced; without one (or without ``resume``, an evaluation), a new run
    is started. Either way the run is tagged with the code (:func:`provenance.code_tags`), the
    execution id (latest and history) and ``train.steps``.
    """
    ours = {RUN_ID_TAG: run_id, WORKFLOW_TAG: workflow}
    end_unfinished_runs(config, ours)
    key = {**ours, CONFIG_HASH_TAG: config_hash(config)}
    previous = _search(config, key, "find the run to continue")[1][:1] if resume else []
    tags = {**code_tags(), EXECUTION_TAG: execution_id}
    if not previous:
        tags[EXECUTIONS_TAG] = execution_id
        return RunTracker.from_config(
            config, run_name=f"{workflow}:{run_id}", tags={**ours, **tags}
        )
    (run,) = previous
    uri, _ = resolve_tracking(config.tracking, config.store)
    tracker = RunTracker.attach(uri, run.info.run_id, config.store.s3_endpoint)
    history = _execution_history(run.data.tags.get(EXECUTIONS_TAG, ""), execution_id)
    tracker.set_tags({**tags, EXECUTIONS_TAG: history, RESUMED_FROM_TAG: run.info.status})
    tracker.log_config(config)
    return tracker


class RunTracker:
    """Logs one training run to MLflow. Create with :meth:`start` or :meth:`attach`.

    ``logged_at_attach`` is :meth:`logged_step` as :meth:`attach` read it (0 for a started
    run): a task that attaches and asks at once needs no second read of the run (a read of a
    run grows with what it holds: ~10 ms on a 240-step run's sqlite store)."""

    def __init__(self, client: MlflowClient, run_id: str, logged_at_attach: int = 0) -> None:
        self.client = client
        self.run_id = run_id
        self.logged_at_attach = logged_at_attach

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
        return cls(client, run_id, int(run.data.tags.get(LOGGED_STEP_TAG, 0)))

    def _op(self, operation: str) -> contextlib.AbstractContextManager[None]:
        return _tracking_op(self.client.tracking_uri, f"{operation} of run {self.run_id}")

    def log_config(self, config: RunConfig | Mapping[str, Any]) -> None:
        """Config as flattened dotted params plus the full ``config.yaml`` artifact, with
        credentials redacted from its URLs; ``train.steps`` as :data:`TRAIN_STEPS_TAG`.

        Params the run already has are left as they are (MLflow params are immutable: a
        continued run keeps the values it was opened with, and ``config.yaml`` is replaced by
        the current config)."""
        from mlflow.entities import Param

        plain = redact_urls(config.to_dict() if hasattr(config, "to_dict") else dict(config))
        flat = flatten(plain)
        text = yaml.safe_dump(plain, sort_keys=False)
        with self._op("log the config"):
            have = self.client.get_run(self.run_id).data.params
            params = [
                Param(k, _param_value(v))
                for k, v in sorted(flat.items())
                if k not in NOT_PARAMS and k not in have
            ]
            for i in range(0, len(params), PARAM_BATCH):
                self.client.log_batch(self.run_id, params=params[i : i + PARAM_BATCH])
            self.client.log_text(self.run_id, text, "config.yaml")
        if "train.steps" in flat:
            self.set_tags({TRAIN_STEPS_TAG: str(flat["train.steps"])})

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
        """Files under ``step_{k:04d}/``: name -> local path (copied) or bytes (written); a name
        may hold folders (``adapter/adapter_config.json``), never ``..`` or a root."""
        for name in files:
            if any(part in ("", ".", "..") for part in name.split("/")):
                raise ValueError(f"artifact name {name!r} must be a relative path inside the step")
        with (
            self._op(f"log the artifacts of step {step}"),
            tempfile.TemporaryDirectory(prefix="evosteer-mlflow-") as tmp,
        ):
            folder = Path(tmp) / step_dir(step)
            folder.mkdir()
            for name, content in files.items():
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
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

    def logged_step(self) -> int:
        """The last step fully logged to this run (:data:`LOGGED_STEP_TAG`; 0 = none)."""
        with self._op("read the logged step"):
            tags = self.client.get_run(self.run_id).data.tags
        return int(tags.get(LOGGED_STEP_TAG, 0))

    def log_training_step(
        self,
        step: int,
        metrics: Mapping[str, float | int | bool],
        files: Mapping[str, bytes],
        store: ArtifactStore,
        refs: Mapping[str, ArtifactRef],
    ) -> None:
        """Log step ``step``: its files, refs, hash tags and metrics, then mark it logged
        (:data:`LOGGED_STEP_TAG`, set last, so a step cut short is logged again in full)."""
        self.log_step_artifacts(step, files)
        self.log_step_refs(step, store, refs, copy=False)
        self.log_step(step, metrics)
        self.set_tags({LOGGED_STEP_TAG: str(step)})

    def register_adapter(
        self, model_name: str, step: int, state_sha256: str, tags: Mapping[str, str]
    ) -> ModelVersion:
        """Register the PEFT adapter logged at ``step`` (``step_{k:04d}/adapter``) as a version
        of ``model_name``, tagged with ``tags``, the step, the state hash and the evaluation
        results of that state found in the experiment; the existing version when that state is
        registered already (a train re-run over its cached steps)."""
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

        with self._op(f"register the adapter of step {step} as {model_name}"):
            query = f"name = '{model_name}' and tag.`{STATE_TAG}` = '{state_sha256}'"
            found = self.client.search_model_versions(query)
            if found:
                return found[0]
            try:
                self.client.create_registered_model(model_name)
            except MlflowException as exc:
                if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                    raise
            run = self.client.get_run(self.run_id)
            all_tags = {
                **tags,
                STEP_TAG: str(step),
                STATE_TAG: state_sha256,
                **{k: run.data.tags[k] for k in code_tags() if k in run.data.tags},
                **evaluation_tags(self.client, run.info.experiment_id, state_sha256),
            }
            return self.client.create_model_version(
                model_name,
                source=f"runs:/{self.run_id}/{step_dir(step)}/{ADAPTER_DIR}",
                run_id=self.run_id,
                tags=all_tags,
            )

    def finish(self, config: RunConfig, state_sha256: str) -> ModelVersion | None:
        """Close a workflow's run FINISHED, tagging the final state's hash; a train's run first
        registers the adapter of its last step (``train.steps``) under
        :func:`registered_model_name`, tagged with the run id, config hash and backbone (its
        version, else None)."""
        self.set_tags({"sha256.final_state": state_sha256})
        with self._op("read the run's tags"):
            tags = self.client.get_run(self.run_id).data.tags
        version = None
        if tags.get(WORKFLOW_TAG) == "train":
            keep = {k: tags[k] for k in (RUN_ID_TAG, CONFIG_HASH_TAG) if k in tags}
            keep[BACKBONE_TAG] = config.policy.backbone
            version = self.register_adapter(
                registered_model_name(config), config.train.steps, state_sha256, keep
            )
        self.end("FINISHED")
        return version

    def location(self) -> dict[str, str]:
        """Where to find this run: tracking URI (redacted), experiment id, run id and the URL
        of its page in the MLflow UI (:func:`ui_url`)."""
        with self._op("read the run's experiment"):
            experiment_id = self.client.get_run(self.run_id).info.experiment_id
        uri = redact_url(self.client.tracking_uri)
        return {
            "tracking_uri": uri,
            "experiment_id": experiment_id,
            "run_id": self.run_id,
            "url": ui_url(uri, experiment_id, self.run_id),
        }

    def end(self, status: str = "FINISHED") -> None:
        """Mark the run FINISHED, FAILED or KILLED."""
        with self._op(f"end ({status})"):
            self.client.set_terminated(self.run_id, status=status)


PARENT_TAG = "mlflow.parentRunId"
"""MLflow's own tag for a nested run: the UI shows an experiment's cells under it."""
CELL_WORKFLOW = "experiment-cell"


def log_experiment_cell(
    config: RunConfig,
    parent_run: str,
    cell_run_id: str,
    row: str,
    seed: int,
    metrics: Mapping[str, float],
) -> str:
    """The FINISHED child run of the experiment's MLflow run ``parent_run`` for one cell
    (tagged with the cell's run id, row and seed; its config and ``metrics``), created once:
    a re-run of the experiment finds it. Returns its MLflow run id."""
    tags = {
        PARENT_TAG: parent_run,
        RUN_ID_TAG: cell_run_id,
        WORKFLOW_TAG: CELL_WORKFLOW,
        "evosteer.row": row,
        "evosteer.seed": str(seed),
    }
    _, found = _search(config, tags, "find the experiment cell's run")
    if found:
        return found[0].info.run_id
    tracker = RunTracker.from_config(config, run_name=f"{row} / seed {seed}", tags=tags)
    tracker.log_step(0, metrics)
    tracker.end("FINISHED")
    return tracker.run_id


LOCAL_UI = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` serves a local (SQLite) tracking store by default."""


def ui_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The page of an MLflow run: on the tracking server itself when the URI is one (http or
    https), else on :data:`LOCAL_UI`, where ``mlflow ui --backend-store-uri <uri>`` serves it."""
    base = (
        tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else LOCAL_UI
    )
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


EVAL_PREFIX = "eval."
"""Evaluation metrics (``eval.<benchmark>.mean``/``.std``) of an evaluate run."""


def evaluation_tags(client: MlflowClient, experiment_id: str, state_sha256: str) -> dict[str, str]:
    """The ``eval.*`` metrics of the newest finished evaluate run of a checkpoint, as tags."""
    query = (
        f"tags.`{WORKFLOW_TAG}` = 'evaluate' and tags.`sha256.checkpoint` = '{state_sha256}'"
        " and attributes.status = 'FINISHED'"
    )
    runs = client.search_runs(
        [experiment_id], filter_string=query, order_by=["attributes.start_time DESC"]
    )
    if not runs:
        return {}
    metrics = runs[0].data.metrics
    return {k: repr(v) for k, v in sorted(metrics.items()) if k.startswith(EVAL_PREFIX)}


def tag_registered_adapters(
    config: RunConfig, model_name: str, state_sha256: str, results: Mapping[str, float]
) -> list[int]:
    """Set evaluation ``results`` as tags on every version of ``model_name`` whose adapter
    comes from the state ``state_sha256``; their version numbers."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

    uri, _ = resolve_tracking(config.tracking, config.store)
    with _tracking_op(uri, f"tag the evaluated versions of {model_name}"):
        client = _client(uri, config.store.s3_endpoint)
        query = f"name = '{model_name}' and tag.`{STATE_TAG}` = '{state_sha256}'"
        try:
            versions = client.search_model_versions(query)
        except MlflowException as exc:
            if exc.error_code != ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
                raise
            versions = []
        for v in versions:
            for key, value in sorted(results.items()):
                client.set_model_version_tag(model_name, v.version, key, repr(float(value)))
    return [int(v.version) for v in versions]


def registered_model_name(config: RunConfig) -> str:
    """The registry name a train's final adapter is registered under: ``<config name>-adapter``."""
    return f"{config.name}-adapter"
