"""One training step as artifact-to-artifact functions over the content-addressed store.

Every stage of :mod:`evosteer_core.training.step` is wrapped here as "read its input artifacts → call the
stage → write its outputs → return refs". The Flyte tasks in ``evosteer_flyte/tasks/`` and the replay in
:mod:`evosteer_core.pipeline.replay` both call these functions, so a replay computes byte for byte what
the pipeline stored. Tables are stored as parquet and validated with the pandera schemas when
read; everything else is stored with ``torch.save`` (deterministic bytes).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from evosteer_core.episode.rollout import rollout_health
from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.schemas import DECISIONS, TRAJECTORIES, validate_rescored, validate_tables
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.training import step as core
from evosteer_core.training.state import TrainState, from_bytes, to_bytes

STEP_ARTIFACTS: tuple[str, ...] = (
    "trajectories",
    "decisions",
    "rescored",
    "value",
    "update",
    "skills",
    "state",
)
"""The artifacts recorded per step in the run index, in the order the stages produce them."""

TABLES = ("trajectories", "decisions", "rescored")


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
@dataclass
class StepStore:
    """Typed access to one store: tables (validated), objects and the train state."""

    store: ArtifactStore

    def put_table(self, df: pd.DataFrame, name: str) -> ArtifactRef:
        return self.store.put_bytes(table_bytes(df), f"{name}.parquet")

    def get_table(self, ref: ArtifactRef) -> pd.DataFrame:
        return read_table(self.store.get_bytes(ref))

    def get_rollouts(
        self, trajectories: ArtifactRef, decisions: ArtifactRef
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Both rollout tables, validated together (a violation raises the pandera report)."""
        traj, dec = self.get_table(trajectories), self.get_table(decisions)
        validate_tables(traj, dec)
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
    """Seed torch's global generator per (run, step, stage): whatever ran before in the process
    (other tasks, a crashed attempt), the stage and the RNG state it checkpoints are the same."""
    torch.manual_seed(derive_seed(cfg.train.seed, step, stage, "torch_global"))


# --- the stages ----------------------------------------------------------------------------
def init_artifacts(cfg: RunConfig, io_: StepStore) -> ArtifactRef:
    """Step 0: the initial train state."""
    seed_stage(cfg, 0, "init")
    return io_.put_state(core.init_state(cfg))


def rollout_artifacts(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    shard: int = 0,
    n_shards: int = 1,
) -> tuple[ArtifactRef, ArtifactRef]:
    """Stage 1 → (trajectories, decisions), for all records or for one of ``n_shards`` shards."""
    seed_stage(cfg, step, "rollout")
    s = core.open_session(cfg, io_.get_state(state))
    traj, dec = core.rollout_stage(s, step, shard=shard, n_shards=n_shards)
    TRAJECTORIES.validate(traj, lazy=True)
    DECISIONS.validate(dec, lazy=True)
    return io_.put_table(traj, "trajectories"), io_.put_table(dec, "decisions")


def concat_rollouts(
    io_: StepStore, shards: list[tuple[ArtifactRef, ArtifactRef]]
) -> tuple[ArtifactRef, ArtifactRef]:
    """Concatenate shard tables in shard order (one shard: the same refs back)."""
    if len(shards) == 1:
        return shards[0]
    tables = [io_.get_rollouts(t, d) for t, d in shards]
    traj = pd.concat([t for t, _ in tables], ignore_index=True)
    dec = pd.concat([d for _, d in tables], ignore_index=True)
    validate_tables(traj, dec)
    return io_.put_table(traj, "trajectories"), io_.put_table(dec, "decisions")


def rescore_artifacts(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    trajectories: ArtifactRef,
    decisions: ArtifactRef,
) -> ArtifactRef:
    """Stage 2 → rescored (ℓ_θ, ℓ_ρ, h_ρ per decision)."""
    seed_stage(cfg, step, "rescore")
    _, dec = io_.get_rollouts(trajectories, decisions)
    s = core.open_session(cfg, io_.get_state(state))
    return io_.put_table(core.rescore_stage(s, dec), "rescored")


def _open_scored(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    stage: str,
    refs: tuple[ArtifactRef, ArtifactRef, ArtifactRef],
) -> tuple[core.Session, TrainState, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Common opening of the stages after re-scoring: seed the stage, load and validate the
    (trajectories, decisions, rescored) tables, and open a session on the previous state."""
    seed_stage(cfg, step, stage)
    traj, dec = io_.get_rollouts(refs[0], refs[1])
    resc = io_.get_table(refs[2])
    validate_rescored(dec, resc)
    st = io_.get_state(state)
    return core.open_session(cfg, st), st, traj, dec, resc


def value_artifacts(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    trajectories: ArtifactRef,
    decisions: ArtifactRef,
    rescored: ArtifactRef,
) -> ArtifactRef:
    """Stage 3 → value: {value_head, outcome_heads, window, metrics}."""
    refs = (trajectories, decisions, rescored)
    s, st, traj, dec, resc = _open_scored(cfg, io_, state, step, "value", refs)
    value_sd, outcome_sd, window, metrics = core.value_stage(s, traj, dec, resc, st.value_window)
    out = {
        "value_head": value_sd,
        "outcome_heads": outcome_sd,
        "window": window,
        "metrics": metrics,
    }
    return io_.put_object(out, "value.pt")


def update_artifacts(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    trajectories: ArtifactRef,
    decisions: ArtifactRef,
    rescored: ArtifactRef,
) -> ArtifactRef:
    """Stage 4 → update: {adapter, flow_head, actor_optimizer, pool, buckets, nonfinite_steps,
    metrics}."""
    refs = (trajectories, decisions, rescored)
    s, st, traj, dec, resc = _open_scored(cfg, io_, state, step, "update", refs)
    upd = core.update_stage(
        s, traj, dec, resc, st.actor_optimizer, nonfinite_steps=st.nonfinite_steps
    )
    return io_.put_object(upd, "update.pt")


def validation_artifacts(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    trajectories: ArtifactRef,
    decisions: ArtifactRef,
) -> ArtifactRef:
    """Stage 5 → skills: {skills, metrics}."""
    seed_stage(cfg, step, "validation")
    traj, dec = io_.get_rollouts(trajectories, decisions)
    s = core.open_session(cfg, io_.get_state(state))
    skills, metrics = core.validation_stage(s, traj, dec, step)
    return io_.put_object({"skills": skills, "metrics": metrics}, "skills.pt")


def checkpoint_artifacts(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    value: ArtifactRef,
    update: ArtifactRef,
    skills: ArtifactRef,
) -> ArtifactRef:
    """Stage 6 → the next train state."""
    seed_stage(cfg, step, "checkpoint")
    v, upd, sk = io_.get_object(value), io_.get_object(update), io_.get_object(skills)
    new = core.checkpoint_stage(
        io_.get_state(state),
        step,
        v["value_head"],
        v["outcome_heads"],
        v["window"],
        upd,
        sk["skills"],
        seed=cfg.train.seed,
    )
    return io_.put_state(new)


def step_metrics(io_: StepStore, refs: Mapping[str, ArtifactRef]) -> dict[str, float]:
    """The step's scalar metrics, read back from its value, update and skills artifacts, and
    its rollout's health (``infra_failures``, ``healthy_fraction``) from the trajectories."""
    out: dict[str, float] = dict(rollout_health(io_.get_table(refs["trajectories"])))
    for name in ("value", "update", "skills"):
        out.update({k: float(v) for k, v in io_.get_object(refs[name])["metrics"].items()})
    return out


def run_step(
    cfg: RunConfig,
    io_: StepStore,
    state: ArtifactRef,
    step: int,
    rollouts: tuple[ArtifactRef, ArtifactRef] | None = None,
) -> dict[str, ArtifactRef]:
    """All stages of one step in-process, in pipeline order → {artifact name: ref}.

    ``rollouts`` given: use those recorded tables instead of sampling (a remote executor's
    rollouts are the recorded truth; everything downstream is recomputed)."""
    traj, dec = rollouts or rollout_artifacts(cfg, io_, state, step)
    resc = rescore_artifacts(cfg, io_, state, step, traj, dec)
    value = value_artifacts(cfg, io_, state, step, traj, dec, resc)
    update = update_artifacts(cfg, io_, state, step, traj, dec, resc)
    skills = validation_artifacts(cfg, io_, state, step, traj, dec)
    new_state = checkpoint_artifacts(cfg, io_, state, step, value, update, skills)
    return {
        "trajectories": traj,
        "decisions": dec,
        "rescored": resc,
        "value": value,
        "update": update,
        "skills": skills,
        "state": new_state,
    }


def tracking_files(io_: StepStore, refs: Mapping[str, ArtifactRef]) -> dict[str, bytes]:
    """The per-step files logged to MLflow: the adapter, the heads, the skill library version
    and the test ledger (JSON, readable without evosteer)."""
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
    return {
        "adapter.pt": object_bytes(state.adapter),
        "heads.pt": object_bytes(heads),
        "skills.json": js(skills.get("library", {})),
        "ledger.json": js(skills.get("ledger", {})),
    }
