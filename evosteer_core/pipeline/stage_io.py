"""One training step as artifact-to-artifact functions over the content-addressed store.

Every stage of :mod:`evosteer_core.training` runs here through one generic wrapper,
:func:`run_stage`: "read its input artifacts → call the stage → write its outputs → return
refs", driven by the :data:`STAGES` table. The Flyte tasks in ``evosteer_flyte/tasks/`` and the
replay in :mod:`evosteer_core.pipeline.replay` both call it, so a replay computes byte for
byte what the pipeline stored. Tables are stored as parquet and validated with the pandera schemas when
read; everything else is stored with ``torch.save`` (deterministic bytes).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from evosteer_core.collabflow.rollout import validate_collab_tables
from evosteer_core.collabflow.rounds import (
    RoundSession,
    RoundUpdate,
    init_round_state,
    open_round,
    round_checkpoint,
    round_rollout,
    round_update,
)
from evosteer_core.episode.budget import TokenUsage
from evosteer_core.episode.rollout import rollout_health
from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.memo import BoundedMemo
from evosteer_core.infra.schemas import DECISIONS, TRAJECTORIES, validate_rescored, validate_tables
from evosteer_core.infra.seeding import derive_seed, settle_threads
from evosteer_core.infra.tracking import ADAPTER_DIR, RunTracker
from evosteer_core.pipeline.usage import StageUsage, UsageLog
from evosteer_core.policy.adapter_export import ADAPTER_FILES, adapter_files
from evosteer_core.training.results import ActorUpdate, Rescored, Rollouts, Validation, ValueFit
from evosteer_core.training.session import Session, init_state, open_session
from evosteer_core.training.stages import (
    checkpoint_stage,
    rescore_stage,
    rollout_stage,
    validation_stage,
    value_stage,
)
from evosteer_core.training.state import TrainState, from_bytes, to_bytes
from evosteer_core.training.update import update_stage

_log = logging.getLogger(__name__)


# --- encodings -----------------------------------------------------------------------------
def table_bytes(df: pd.DataFrame) -> bytes:
    """Parquet bytes of a table (no index, no pandas metadata): equal tables, equal bytes."""
    table = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
    table = table.replace_schema_metadata(None)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False)
    return buf.getvalue()


def read_table(data: bytes) -> pd.DataFrame:
    """A table from parquet bytes, with list cells back as Python lists (as the stages made them)."""
    df = pq.read_table(io.BytesIO(data)).to_pandas()
    for col in df.columns:
        if df[col].dtype == object and len(df) and isinstance(df[col].iloc[0], np.ndarray):
            df[col] = df[col].map(lambda a: a.tolist())
    return df


def object_bytes(obj: Any) -> bytes:
    """Deterministic bytes of a torch-saveable object (state dicts, metrics, skill state)."""
    return to_bytes(obj)


# --- reading and writing step artifacts ----------------------------------------------------
VALIDATED_ROLLOUTS: BoundedMemo[tuple[str, str, str], None] = BoundedMemo(256)
"""(trajectories sha256, decisions sha256, validation) of the rollout tables this process has
validated: a table's bytes are verified against its hash when read, so a validated pair stays
valid; a step's four later stages read its rollouts (pandera, ~50 ms a read on tiny-sim)."""


@dataclass
class StepStore:
    """Typed access to one store: tables (validated), objects and the train state."""

    store: ArtifactStore

    def put_table(self, df: pd.DataFrame, name: str) -> ArtifactRef:
        return self.store.put_bytes(table_bytes(df), f"{name}.parquet")

    def get_table(self, ref: ArtifactRef) -> pd.DataFrame:
        return read_table(self.store.get_bytes(ref))

    def get_rollouts(
        self,
        trajectories: ArtifactRef,
        decisions: ArtifactRef,
        validate: Callable[[pd.DataFrame, pd.DataFrame], None] = validate_tables,
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Both rollout tables, validated together (a violation raises the pandera report);
        ``validate``: the method's validation (:attr:`Method.validate_rollouts`). A pair this
        process validated before is not validated again (:data:`VALIDATED_ROLLOUTS`)."""
        traj, dec = self.get_table(trajectories), self.get_table(decisions)
        check = f"{validate.__module__}.{validate.__qualname__}"
        key = (trajectories.sha256, decisions.sha256, check)
        VALIDATED_ROLLOUTS.get(key, lambda: validate(traj, dec))
        return traj, dec

    def put_object(self, obj: Any, name: str) -> ArtifactRef:
        return self.store.put_bytes(object_bytes(obj), name)

    def get_object(self, ref: ArtifactRef) -> Any:
        return from_bytes(self.store.get_bytes(ref))

    def put_state(self, state: TrainState) -> ArtifactRef:
        return self.store.put_bytes(state.to_bytes(), f"state-{state.step:06d}.pt")

    def get_state(self, ref: ArtifactRef) -> TrainState:
        return TrainState.from_bytes(self.store.get_bytes(ref))


def seed_stage(cfg: RunConfig, step: int, stage: str) -> None:
    """Seed torch's global generator per (run, step, stage) and settle its thread pool: whatever
    ran before in the process (other tasks, a crashed attempt, a caller's
    ``torch.set_num_threads``), the stage, its bytes and the RNG state it checkpoints are the
    same."""
    settle_threads()
    torch.manual_seed(derive_seed(cfg.train.seed, step, stage, "torch_global"))


# --- the stages ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StageCall:
    """What a stage runs on: the config, the step, the previous state, its loaded inputs
    (typed results: ``rollouts``, ``rescored``, ``value``, ``update``, ``skills``) and options."""

    cfg: RunConfig
    step: int
    state: TrainState
    inputs: dict[str, Any]
    options: dict[str, int]
    tokens: TokenUsage = field(default_factory=TokenUsage)
    """Filled by the rollout: the tokens its episodes used (for the run's usage record)."""

    def session(self) -> Session:
        """A session on the previous state (opened by the stages that need live objects)."""
        return open_session(self.cfg, self.state)

    def round(self) -> RoundSession:
        """CollabFlow's live objects on the previous state."""
        return open_round(self.cfg, self.state)


@dataclass(frozen=True)
class Stage:
    """One stage of a step: the step artifacts it reads and writes, how it runs, and the pod
    kind it runs on on a cluster (``gpu``: the policy's passes; ``cpu``)."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    run: Callable[[StageCall], dict[str, Any]]
    device: Literal["gpu", "cpu"]


def _rollout(c: StageCall) -> dict[str, Any]:
    out = rollout_stage(c.session(), c.step, **c.options)
    c.tokens.add(out.usage)
    TRAJECTORIES.validate(out.trajectories, lazy=True)
    DECISIONS.validate(out.decisions, lazy=True)
    return {"trajectories": out.trajectories, "decisions": out.decisions}


def _rescore(c: StageCall) -> dict[str, Any]:
    return {"rescored": rescore_stage(c.session(), c.inputs["rollouts"].decisions).table}


def _value(c: StageCall) -> dict[str, Any]:
    fit = value_stage(c.session(), c.inputs["rollouts"], c.inputs["rescored"], c.state.value_window)
    return {"value": fit}


def _update(c: StageCall) -> dict[str, Any]:
    upd = update_stage(
        c.session(),
        c.inputs["rollouts"],
        c.inputs["rescored"],
        c.state.actor_optimizer,
        nonfinite_steps=c.state.nonfinite_steps,
    )
    return {"update": upd}


def _validation(c: StageCall) -> dict[str, Any]:
    return {"skills": validation_stage(c.session(), c.inputs["rollouts"], c.step)}


def _checkpoint(c: StageCall) -> dict[str, Any]:
    i = c.inputs
    new = checkpoint_stage(
        c.state, c.step, i["value"], i["update"], i["skills"], seed=c.cfg.train.seed
    )
    return {"state": new}


ROLLOUT_TABLES = ("trajectories", "decisions")
STAGES: tuple[Stage, ...] = (
    Stage("rollout", (), ROLLOUT_TABLES, _rollout, "gpu"),
    Stage("rescore", ROLLOUT_TABLES, ("rescored",), _rescore, "gpu"),
    Stage("value", (*ROLLOUT_TABLES, "rescored"), ("value",), _value, "cpu"),
    Stage("update", (*ROLLOUT_TABLES, "rescored"), ("update",), _update, "gpu"),
    Stage("validation", ROLLOUT_TABLES, ("skills",), _validation, "cpu"),
    Stage("checkpoint", ("value", "update", "skills"), ("state",), _checkpoint, "cpu"),
)
"""The stages of a step in pipeline order; every layer (this module's :func:`run_step`, the
Flyte tasks and the train workflow) runs a stage through this table, under its name."""

STEP_ARTIFACTS: tuple[str, ...] = tuple(name for stage in STAGES for name in stage.writes)
"""The artifacts EvoSteer records per step in the run index, in the order the stages produce
them (:func:`step_artifacts`: any method's)."""


def _round_rollout(c: StageCall) -> dict[str, Any]:
    out = round_rollout(c.round(), c.step, **c.options)
    c.tokens.add(out.usage)
    return {"trajectories": out.trajectories, "decisions": out.decisions}


def _round_update(c: StageCall) -> dict[str, Any]:
    update = round_update(
        c.round(),
        c.inputs["rollouts"],
        c.state.actor_optimizer,
        nonfinite_steps=c.state.nonfinite_steps,
    )
    return {"round": update}


def _round_checkpoint(c: StageCall) -> dict[str, Any]:
    return {"state": round_checkpoint(c.state, c.step, c.inputs["round"], seed=c.cfg.train.seed)}


COLLABFLOW_STAGES: tuple[Stage, ...] = (
    Stage("rollout", (), ROLLOUT_TABLES, _round_rollout, "gpu"),
    Stage("update", ROLLOUT_TABLES, ("round",), _round_update, "gpu"),
    Stage("checkpoint", ("round",), ("state",), _round_checkpoint, "cpu"),
)
"""A CollabFlow round (docs/collabflow.md §4): the director's teams built and run, the CTB
update with the counters after it, the checkpoint. Stage names and pod kinds are EvoSteer's,
so one Flyte task per name serves both methods."""


@dataclass(frozen=True)
class Method:
    """What a ``method`` trains with: its stages in pipeline order, its step-0 state and the
    validation of its rollout tables."""

    stages: tuple[Stage, ...]
    init: Callable[[RunConfig], TrainState]
    validate_rollouts: Callable[[pd.DataFrame, pd.DataFrame], None]

    @property
    def artifacts(self) -> tuple[str, ...]:
        """The artifacts recorded per step, in the order the stages produce them."""
        return tuple(name for stage in self.stages for name in stage.writes)

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


METHODS: dict[str, Method] = {
    "evosteer": Method(STAGES, init_state, validate_tables),
    "collabflow": Method(COLLABFLOW_STAGES, init_round_state, validate_collab_tables),
}
"""The one place a run's ``method`` selects its stages (keys: ``infra.config.METHODS``)."""


def method_of(cfg: RunConfig) -> Method:
    return METHODS[cfg.method]


def step_artifacts(cfg: RunConfig) -> tuple[str, ...]:
    """The artifacts a step of ``cfg``'s method records."""
    return method_of(cfg).artifacts


TABLES = (*ROLLOUT_TABLES, "rescored")

_OBJECTS = {"value": ValueFit, "update": ActorUpdate, "skills": Validation, "round": RoundUpdate}


def _load_inputs(
    io_: StepStore, refs: Mapping[str, ArtifactRef], reads: tuple[str, ...], method: Method
):
    """The typed inputs of a stage; tables are validated (rollouts together, rescored against
    the decisions)."""
    missing = [name for name in reads if name not in refs]
    if missing:
        raise ValueError(f"stage inputs missing: {missing}")
    inputs: dict[str, Any] = {}
    if "trajectories" in reads:
        tables = io_.get_rollouts(refs["trajectories"], refs["decisions"], method.validate_rollouts)
        inputs["rollouts"] = Rollouts(*tables)
    if "rescored" in reads:
        table = io_.get_table(refs["rescored"])
        validate_rescored(inputs["rollouts"].decisions, table)
        inputs["rescored"] = Rescored(table)
    for name, kind in _OBJECTS.items():
        if name in reads:
            inputs[name] = kind.from_dict(io_.get_object(refs[name]))
    return inputs


def _store_output(io_: StepStore, name: str, value: Any) -> ArtifactRef:
    if isinstance(value, pd.DataFrame):
        return io_.put_table(value, name)
    if isinstance(value, TrainState):
        return io_.put_state(value)
    return io_.put_object(value.to_dict(), f"{name}.pt")


def run_stage(
    cfg: RunConfig,
    io_: StepStore,
    name: str,
    state: ArtifactRef,
    step: int,
    refs: Mapping[str, ArtifactRef],
    usage: UsageLog | None = None,
    **options: int,
) -> dict[str, ArtifactRef]:
    """Run stage ``name`` of ``step`` from stored artifacts: seed it, load the previous state
    and the inputs it reads from ``refs``, run it, store what it writes → {name: ref}.
    ``usage`` given: record what the stage used there (``pipeline/usage.py``; the pipeline's
    tasks do, the replay does not). ``options``: the rollout stage's ``shard`` and ``n_shards``."""
    method = method_of(cfg)
    stage = method.stage(name)
    _log.info("step %d: %s", step, name, extra={"stage": name, "step": step})
    started = time.perf_counter()
    seed_stage(cfg, step, name)
    inputs = _load_inputs(io_, refs, stage.reads, method)
    call = StageCall(cfg, step, io_.get_state(state), inputs, dict(options))
    written = {out: _store_output(io_, out, value) for out, value in stage.run(call).items()}
    if usage is not None:
        seconds = time.perf_counter() - started
        shard = options.get("shard", 0)
        usage.record(step, StageUsage(name, stage.device, seconds, call.tokens, shard))
    return written


def init_artifacts(cfg: RunConfig, io_: StepStore) -> ArtifactRef:
    """Step 0: the initial train state of the run's method."""
    seed_stage(cfg, 0, "init")
    return io_.put_state(method_of(cfg).init(cfg))


def concat_rollouts(
    cfg: RunConfig, io_: StepStore, shards: list[Mapping[str, ArtifactRef]]
) -> dict[str, ArtifactRef]:
    """Concatenate shard tables in shard order (one shard: the same refs back)."""
    if len(shards) == 1:
        return {name: shards[0][name] for name in ROLLOUT_TABLES}
    validate = method_of(cfg).validate_rollouts
    tables = [io_.get_rollouts(s["trajectories"], s["decisions"], validate) for s in shards]
    traj = pd.concat([t for t, _ in tables], ignore_index=True)
    dec = pd.concat([d for _, d in tables], ignore_index=True)
    validate(traj, dec)
    return {
        "trajectories": io_.put_table(traj, "trajectories"),
        "decisions": io_.put_table(dec, "decisions"),
    }


METRIC_ARTIFACTS = ("trajectories", "value", "update", "skills", "round")
"""The artifacts :func:`step_metrics` reads (those a step has)."""
STEP_METRICS: BoundedMemo[tuple[tuple[str, str], ...], dict[str, float]] = BoundedMemo(4096)
""":func:`step_metrics` by the sha256 of each artifact it reads, kept in the process: the
metrics are a function of those contents, and a local run asks for each step's three times
(MLflow, the training Decks, the progress bar), each a read of ~70 ms of tables and objects."""
_STEP_METRICS_LOCK = threading.Lock()
"""The progress bar reads step metrics from its own thread."""


def step_metrics(io_: StepStore, refs: Mapping[str, ArtifactRef]) -> dict[str, float]:
    """The step's scalar metrics, read back from its value, update and skills artifacts (a
    CollabFlow round's: its round artifact), and its rollout's health (``infra_failures``,
    ``healthy_fraction``) from the trajectories; each set of artifacts is read once a process
    (:data:`STEP_METRICS`)."""
    key = tuple((name, refs[name].sha256) for name in METRIC_ARTIFACTS if name in refs)
    with _STEP_METRICS_LOCK:
        return dict(STEP_METRICS.get(key, lambda: _read_step_metrics(io_, refs)))


def _read_step_metrics(io_: StepStore, refs: Mapping[str, ArtifactRef]) -> dict[str, float]:
    out: dict[str, float] = dict(rollout_health(io_.get_table(refs["trajectories"])))
    for name in [n for n in METRIC_ARTIFACTS[1:] if n in refs]:
        out.update({k: float(v) for k, v in io_.get_object(refs[name])["metrics"].items()})
    return out


def run_step(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    rollouts: Mapping[str, ArtifactRef] | None = None,
) -> dict[str, ArtifactRef]:
    """All stages of one step in-process, in pipeline order → {artifact name: ref}.

    ``rollouts`` given ({trajectories, decisions}): use those recorded tables instead of
    sampling (a remote executor's rollouts are the recorded truth; everything downstream is
    recomputed)."""
    refs: dict[str, ArtifactRef] = dict(rollouts or {})
    for stage in method_of(cfg).stages:
        if not (rollouts and stage.name == "rollout"):
            refs.update(run_stage(cfg, io_, stage.name, state, step, refs))
    return {name: refs[name] for name in step_artifacts(cfg)}


TRACKING_FILES: tuple[str, ...] = (
    *(f"{ADAPTER_DIR}/{name}" for name in ADAPTER_FILES),
    "heads.pt",
    "skills.json",
    "ledger.json",
)
"""The files each step logs to MLflow under ``step_{k:04d}/`` (besides ``refs.json``)."""


def tracking_files(
    cfg: RunConfig, io_: StepStore, refs: Mapping[str, ArtifactRef]
) -> dict[str, bytes]:
    """The per-step files logged to MLflow (:data:`TRACKING_FILES`): the adapter as a PEFT
    folder, the heads, the skill library version and the test ledger (JSON, readable without
    evosteer). Only what MLflow gets; the store keeps the train state as it is."""
    import json

    state: TrainState = io_.get_state(refs["state"])
    skills = state.skills or {}

    def js(obj: Any) -> bytes:
        return json.dumps(obj, sort_keys=True, indent=1, default=str).encode("utf-8")

    heads = {
        "value_head": state.value_head,
        "outcome_heads": state.outcome_heads,
        "flow_head": state.flow_head,
    }
    adapter = adapter_files(cfg.policy, state.adapter)
    files = {
        **{f"{ADAPTER_DIR}/{name}": data for name, data in adapter.items()},
        "heads.pt": object_bytes(heads),
        "skills.json": js(skills.get("library", {})),
        "ledger.json": js(skills.get("ledger", {})),
    }
    return {name: files[name] for name in TRACKING_FILES}


def track_step(
    cfg: RunConfig,
    io_: StepStore,
    tracker: RunTracker,
    step: int,
    refs: Mapping[str, ArtifactRef],
    extra: Mapping[str, float] | None = None,
) -> None:
    """Log ``step`` to the run's MLflow run: metrics (the step's own and ``extra``: its cost),
    :func:`tracking_files`, refs. The caller logs only a step the run does not hold yet
    (``tracker.logged_at_attach``: a resumed or extended train re-records its cached steps)."""
    files = tracking_files(cfg, io_, refs)
    metrics = {**step_metrics(io_, refs), **(extra or {})}
    tracker.log_training_step(step, metrics, files, io_.store, refs)
