"""One Flyte task per stage of a training step, plus ``init_run``.

Each task: load its input artifacts → call the evosteer_core stage (through
:mod:`evosteer_core.pipeline.stage_io`, the same code the replay runs) → store the outputs → return refs.
All are cached; the key is (run spec: config hash, seed, store root; step; input refs) under
``CACHE_VERSION``. The config text is an ignored input (its hash is in the spec).
"""

from dataclasses import dataclass

from flytekit import Cache, task

from evosteer_core.infra.artifacts import ArtifactRef
from evosteer_core.pipeline import stage_io
from evosteer_flyte.tasks.errors import executor_outage_is_recoverable
from evosteer_flyte.tasks.resources import (
    CACHE_VERSION,
    CPU_IMAGE,
    CPU_RESOURCES,
    GPU_ACCELERATOR,
    GPU_IMAGE,
    GPU_RESOURCES,
    RETRIES,
)
from evosteer_flyte.tasks.spec import RunSpec, load, store_of


@dataclass
class Rollouts:
    """The two rollout tables of a step (parquet artifacts, pandera-validated on load)."""

    trajectories: ArtifactRef
    decisions: ArtifactRef


CACHE = Cache(version=CACHE_VERSION, ignored_inputs=("config_yaml",))
CPU_TASK = dict(
    cache=CACHE,
    retries=RETRIES,
    container_image=CPU_IMAGE,
    requests=CPU_RESOURCES,
    limits=CPU_RESOURCES,
)
GPU_TASK = dict(
    cache=CACHE,
    retries=RETRIES,
    container_image=GPU_IMAGE,
    requests=GPU_RESOURCES,
    limits=GPU_RESOURCES,
    accelerator=GPU_ACCELERATOR,
)


@task(**CPU_TASK)
def init_run(spec: RunSpec, config_yaml: str) -> ArtifactRef:
    """The step-0 train state."""
    cfg, io = load(spec, config_yaml)
    return stage_io.init_artifacts(cfg, io)


@task(**GPU_TASK)
def rollout(spec: RunSpec, config_yaml: str, step: int, state: ArtifactRef) -> Rollouts:
    """Stage 1: the step's trajectories and decisions (an executor outage is retried)."""
    cfg, io = load(spec, config_yaml)
    with executor_outage_is_recoverable():
        return Rollouts(*stage_io.rollout_artifacts(cfg, io, state, step))


@task(**GPU_TASK)
def rollout_shard(
    spec: RunSpec, config_yaml: str, step: int, state: ArtifactRef, shard: int, n_shards: int
) -> Rollouts:
    """Stage 1 for one record shard (the remote fan-out; ``gather_rollouts`` joins them)."""
    cfg, io = load(spec, config_yaml)
    with executor_outage_is_recoverable():
        return Rollouts(*stage_io.rollout_artifacts(cfg, io, state, step, shard, n_shards))


@task(**CPU_TASK)
def gather_rollouts(spec: RunSpec, shards: list[Rollouts]) -> Rollouts:
    """Concatenate shard tables in shard order (validated)."""
    io = stage_io.StepStore(store_of(spec))
    return Rollouts(*stage_io.concat_rollouts(io, [(s.trajectories, s.decisions) for s in shards]))


@task(**GPU_TASK)
def rescore(
    spec: RunSpec, config_yaml: str, step: int, state: ArtifactRef, rollouts: Rollouts
) -> ArtifactRef:
    """Stage 2: ℓ_θ, ℓ_ρ and h_ρ of every recorded decision."""
    cfg, io = load(spec, config_yaml)
    return stage_io.rescore_artifacts(
        cfg, io, state, step, rollouts.trajectories, rollouts.decisions
    )


@task(**CPU_TASK)
def fit_value_head(
    spec: RunSpec,
    config_yaml: str,
    step: int,
    state: ArtifactRef,
    rollouts: Rollouts,
    rescored: ArtifactRef,
) -> ArtifactRef:
    """Stage 3: value head on the replay window, diagnostic outcome heads."""
    cfg, io = load(spec, config_yaml)
    return stage_io.value_artifacts(
        cfg, io, state, step, rollouts.trajectories, rollouts.decisions, rescored
    )


@task(**GPU_TASK)
def anchortb_update(
    spec: RunSpec,
    config_yaml: str,
    step: int,
    state: ArtifactRef,
    rollouts: Rollouts,
    rescored: ArtifactRef,
) -> ArtifactRef:
    """Stage 4: anchor statistics, structural buckets and one AnchorTB step."""
    cfg, io = load(spec, config_yaml)
    return stage_io.update_artifacts(
        cfg, io, state, step, rollouts.trajectories, rollouts.decisions, rescored
    )


@task(**CPU_TASK)
def validation_round(
    spec: RunSpec, config_yaml: str, step: int, state: ArtifactRef, rollouts: Rollouts
) -> ArtifactRef:
    """Stage 5: paired trials, sequential tests, the author window."""
    cfg, io = load(spec, config_yaml)
    return stage_io.validation_artifacts(
        cfg, io, state, step, rollouts.trajectories, rollouts.decisions
    )


@task(**CPU_TASK)
def checkpoint(
    spec: RunSpec,
    config_yaml: str,
    step: int,
    state: ArtifactRef,
    value: ArtifactRef,
    update: ArtifactRef,
    skills: ArtifactRef,
) -> ArtifactRef:
    """Stage 6: the next train state."""
    cfg, io = load(spec, config_yaml)
    return stage_io.checkpoint_artifacts(cfg, io, state, step, value, update, skills)
