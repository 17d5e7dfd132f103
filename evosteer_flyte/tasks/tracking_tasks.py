"""Uncached bookkeeping tasks: the run index and MLflow, once per workflow execution.

They run on every execution (cache hits included). A train continues the MLflow run of its run
id (``tracking.open_run``), so a resumed or extended run has one MLflow run holding every step's
metrics and artifacts once; steps it holds already are not logged again. With
``tracking.enabled: false`` the run index is still written and MLflow is left alone (an empty
MLflow run id).
"""

import os
import socket
import time

from flytekit import Deck, current_context, task
from flytekit.types.error import FlyteError

from evosteer_core.infra.artifacts import ArtifactRef, RunIndex
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.configio import InputError
from evosteer_core.infra.runs import record_config, record_provenance, run_id_for
from evosteer_core.infra.tracking import RunTracker, end_failed_run, open_run, resolve_tracking
from evosteer_core.pipeline import costs, stage_io
from evosteer_core.pipeline.report import deck_html, run_history
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.resources import CPU_IMAGE, LIGHT_RESOURCES, RETRIES
from evosteer_flyte.tasks.spec import RunSpec, load, require_stored, train_config

LIGHT_TASK = dict(
    retries=RETRIES, container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES
)
DECK = dict(enable_deck=True, deck_fields=())
"""A task that shows our Deck only: not flytekit's input deck (the config text it would print
can hold credentials), nor its output, source, dependency or timeline decks."""
DECK_EVERY = 10
"""``record_step`` draws the training Deck every this many steps and at the run's last step:
the plots read every step so far from the store, so drawing them at every step would cost a
long run's store reads quadratically."""
LOCAL_EXECUTION = ("local", "local", "local")
"""flytekit's placeholder execution id in a local (in-process) execution."""
WARM_START_ENTRY = "warm_start"
"""Run-index name (step 0) of the warm-started backbone's weights (docs/warm_start.md)."""
WARM_START_TAG = "sha256.warm_start"
"""MLflow tag of the warm start's sha256 (its spec is logged with the config's params)."""


def _execution_id() -> str:
    """``project:domain:name`` of the Flyte execution; a local execution (which flytekit names
    ``local:local:local``) gets ``local:<host>:<UTC start>-<pid>`` instead."""
    ex = current_context().execution_id
    if (ex.project, ex.domain, ex.name) == LOCAL_EXECUTION:
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        return f"local:{socket.gethostname()}:{started}-{os.getpid()}"
    return f"{ex.project}:{ex.domain}:{ex.name}"


def _tracker(config_yaml: str, spec: RunSpec, mlflow_run: str) -> RunTracker | None:
    if not mlflow_run:
        return None
    return _attach(load(spec, config_yaml)[0], mlflow_run)


def _attach(cfg: RunConfig, mlflow_run: str) -> RunTracker | None:
    """The MLflow run ``mlflow_run`` of a loaded config ('' = tracking off: None)."""
    if not mlflow_run:
        return None
    uri, _ = resolve_tracking(cfg.tracking, cfg.store)
    return RunTracker.attach(uri, mlflow_run, cfg.store.s3_endpoint)


@task(**LIGHT_TASK)
@infrastructure_is_recoverable()
def start_tracking(spec: RunSpec, config_yaml: str, workflow: str) -> str:
    """The MLflow run of this execution (``tracking.open_run``): a train or an experiment
    continues the run of its run id, an evaluation opens a new one; its id or ''."""
    cfg, _ = load(spec, config_yaml)
    if not cfg.tracking.enabled:
        return ""
    resume = workflow in ("train", "experiment")
    tracker = open_run(cfg, spec.run_id, workflow, _execution_id(), resume)
    if cfg.policy.init is not None and cfg.policy.init.ref is not None:
        tracker.set_tags({WARM_START_TAG: cfg.policy.init.ref.sha256})
    return tracker.run_id


@task(**LIGHT_TASK)
@infrastructure_is_recoverable()
def record_init(
    spec: RunSpec, config_yaml: str, state: ArtifactRef, mlflow_run: str = ""
) -> ArtifactRef:
    """Record the config (``runs.record_config``: redacted, replaced on every execution), this
    execution's code and MLflow run (``runs.record_provenance``), the step-0 state and, with
    ``policy.init``, the warm-started weights (:data:`WARM_START_ENTRY`) in the run index;
    pass the state on."""
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, {"state": state}, "init_run")
    record_config(io.store, spec.run_id, cfg)
    tracker = _tracker(config_yaml, spec, mlflow_run)
    record_provenance(io.store, spec.run_id, tracker.location() if tracker else None)
    index = RunIndex(io.store, spec.run_id)
    index.record(0, "state", state)
    if cfg.policy.init is not None and cfg.policy.init.ref is not None:
        index.record(0, WARM_START_ENTRY, cfg.policy.init.ref)
    return state


@task(**LIGHT_TASK, **DECK)
@infrastructure_is_recoverable()
def record_step(
    spec: RunSpec, config_yaml: str, mlflow_run: str, step: int, refs: dict[str, ArtifactRef]
) -> ArtifactRef:
    """Record every artifact of ``step`` (``refs``: ``stage_io.step_artifacts`` by name) in the
    run index, the state last (a step whose state the index holds is recorded in full: the
    progress bar reads it so), and log the step to MLflow once (``stage_io.track_step``): metrics (with the
    step's cost and the spend so far, ``costs.run_spend``), the adapter (a PEFT folder) and
    heads, the skill library version and the test ledger (JSON), and the artifact hashes as
    tags. Every :data:`DECK_EVERY` steps and at the last, its Deck shows the report's plots of
    the run so far. Then the run budget (``costs.check_run_budget``): a next step that would
    exceed it stops the run here. Returns the new state (so the next step waits for it).

    A step its MLflow run holds already (a resumed, extended or cached re-run) is only
    re-recorded in the index: no Deck (nothing new to show; ``evosteer report`` draws the
    run), and its spend is read only when ``budget.run_cost`` needs it."""
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, refs, f"step {step}")
    index = RunIndex(io.store, spec.run_id)
    for name, ref in sorted(refs.items(), key=lambda item: item[0] == "state"):
        index.record(step, name, ref)  # the state last: a step with one is recorded in full
    tracker = _attach(cfg, mlflow_run)
    logged = tracker is not None and step <= tracker.logged_at_attach
    if not logged and (step % DECK_EVERY == 0 or step == cfg.train.steps):
        history = run_history(io.store, spec.run_id)
        Deck("Training", deck_html(history, spec.run_id))
    if logged and cfg.budget.run_cost is None:
        return refs["state"]
    spend = costs.run_spend(cfg, io.store, spec.run_id, through=step)
    if tracker is not None and not logged:
        stage_io.track_step(cfg, io, tracker, step, refs, spend.metrics(step))
    costs.check_run_budget(cfg, spend, step)
    return refs["state"]


@task(**LIGHT_TASK)
@infrastructure_is_recoverable()
def end_tracking(spec: RunSpec, config_yaml: str, mlflow_run: str, state: ArtifactRef) -> str:
    """Close the MLflow run (``RunTracker.finish``: the final state's hash; a train registers
    its final adapter as a model version); returns the MLflow run id."""
    tracker = _tracker(config_yaml, spec, mlflow_run)
    if tracker is not None:
        cfg, _ = load(spec, config_yaml)
        tracker.finish(cfg, state.sha256)
    return mlflow_run


@task(**LIGHT_TASK)
@infrastructure_is_recoverable()
def fail_tracking(
    config_yaml: str, steps: int, rollout_shards: int, err: FlyteError | None = None
) -> None:
    """The failure handler of the cluster's train workflow (``launch.train``, its
    ``on_failure``; same inputs plus the error): end the run's MLflow run FAILED with the
    error as its end reason (``tracking.end_failed_run``), as the CLI does for a local train.
    A run whose staging failed never opened an MLflow run: there is nothing to end."""
    try:
        cfg = train_config(config_yaml, steps)
    except InputError:  # the train failed on its config or data, before it opened a run
        return
    message = err.message if err is not None else "the train workflow failed"
    where = f" (node {err.failed_node_id})" if err is not None and err.failed_node_id else ""
    end_failed_run(cfg, run_id_for(cfg), "train", f"{message}{where}")
