"""Uncached bookkeeping tasks: the run index and MLflow, once per workflow execution.

They run on every execution (cache hits included), so a resumed or extended run's MLflow run
has every step's metrics and artifacts. With ``tracking.enabled: false`` the run index is still
written and MLflow is left alone (an empty MLflow run id).
"""

from flytekit import current_context, task

from evosteer_core.infra.artifacts import ArtifactRef, RunIndex
from evosteer_core.infra.runs import record_config
from evosteer_core.infra.tracking import (
    EXECUTION_TAG,
    RunTracker,
    end_unfinished_runs,
    resolve_tracking,
)
from evosteer_core.pipeline import stage_io
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.resources import CPU_IMAGE, LIGHT_RESOURCES, RETRIES
from evosteer_flyte.tasks.spec import RunSpec, load, require_stored

LIGHT_TASK = dict(
    retries=RETRIES, container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES
)
RUN_ID_TAG = "evosteer.run_id"


def _execution_id() -> str:
    ex = current_context().execution_id
    return f"{ex.project}:{ex.domain}:{ex.name}"


def _tracker(config_yaml: str, spec: RunSpec, mlflow_run: str) -> RunTracker | None:
    if not mlflow_run:
        return None
    cfg, _ = load(spec, config_yaml)
    uri, _ = resolve_tracking(cfg.tracking, cfg.store)
    return RunTracker.attach(uri, mlflow_run, cfg.store.s3_endpoint)


@task(**LIGHT_TASK)
@infrastructure_is_recoverable()
def start_tracking(spec: RunSpec, config_yaml: str, workflow: str) -> str:
    """Open the MLflow run of this workflow execution (config as params); its id or ''.
    Runs of the same run id and workflow left RUNNING by a process that died are marked KILLED
    first, so one run id has at most one RUNNING MLflow run."""
    cfg, _ = load(spec, config_yaml)
    if not cfg.tracking.enabled:
        return ""
    ours = {RUN_ID_TAG: spec.run_id, "evosteer.workflow": workflow}
    end_unfinished_runs(cfg, ours)
    tags = {EXECUTION_TAG: _execution_id(), **ours}
    return RunTracker.from_config(cfg, run_name=f"{workflow}:{spec.run_id}", tags=tags).run_id


@task(**LIGHT_TASK)
@infrastructure_is_recoverable()
def record_init(spec: RunSpec, config_yaml: str, state: ArtifactRef) -> ArtifactRef:
    """Record the config (``runs.record_config``: redacted, replaced on every execution) and
    the step-0 state in the run index; pass the state on."""
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, {"state": state}, "init_run")
    record_config(io.store, spec.run_id, cfg)
    RunIndex(io.store, spec.run_id).record(0, "state", state)
    return state


@task(**LIGHT_TASK)
@infrastructure_is_recoverable()
def record_step(
    spec: RunSpec, config_yaml: str, mlflow_run: str, step: int, refs: dict[str, ArtifactRef]
) -> ArtifactRef:
    """Record every artifact of ``step`` (``refs``: ``stage_io.STEP_ARTIFACTS`` by name) in the
    run index and log the step to MLflow: metrics, the adapter and heads, the skill library
    version and the test ledger (JSON), and the artifact hashes as tags. Returns the new state
    (so the next step waits for it)."""
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, refs, f"step {step}")
    index = RunIndex(io.store, spec.run_id)
    for name, ref in refs.items():
        index.record(step, name, ref)
    tracker = _tracker(config_yaml, spec, mlflow_run)
    if tracker is not None:
        tracker.log_step(step, stage_io.step_metrics(io, refs))
        tracker.log_step_artifacts(step, stage_io.tracking_files(io, refs))
        tracker.log_step_refs(step, io.store, refs, copy=False)
    return refs["state"]


@task(**LIGHT_TASK)
@infrastructure_is_recoverable()
def end_tracking(spec: RunSpec, config_yaml: str, mlflow_run: str, state: ArtifactRef) -> str:
    """Close the MLflow run (tagging the final state's hash); returns the MLflow run id."""
    tracker = _tracker(config_yaml, spec, mlflow_run)
    if tracker is not None:
        tracker.set_tags({"sha256.final_state": state.sha256})
        tracker.end("FINISHED")
    return mlflow_run
