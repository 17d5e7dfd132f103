"""One Flyte task per stage of a training step, plus ``init_run`` and the rollout fan-out.

A stage runs in ``gpu_stage`` or ``cpu_stage`` (the same body, two pod kinds): load the
config, run the named stage through :func:`evosteer_core.pipeline.stage_io.run_stage` (the
same code the replay runs), return the refs it stored. All are cached; the key is (run spec: config hash, seed, store id; step; input refs) under
``CACHE_VERSION``. The config text is an ignored input (its hash is in the spec). Every task
checks that its input refs are in the run's store before reading them (``require_stored``),
and turns infrastructure failures into retried ones (``infrastructure_is_recoverable``).
"""

from flytekit import Cache, task

from evosteer_core.infra.artifacts import ArtifactRef
from evosteer_core.pipeline import stage_io
from evosteer_core.pipeline.usage import UsageLog
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.resources import (
    CACHE_VERSION,
    CPU_IMAGE,
    CPU_RESOURCES,
    GPU_ACCELERATOR,
    GPU_IMAGE,
    GPU_RESOURCES,
    RETRIES,
)
from evosteer_flyte.tasks.spec import RunSpec, load, require_stored

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
@infrastructure_is_recoverable()
def init_run(spec: RunSpec, config_yaml: str) -> ArtifactRef:
    """The step-0 train state."""
    cfg, io = load(spec, config_yaml)
    return stage_io.init_artifacts(cfg, io)


Refs = dict[str, ArtifactRef]
"""A step's artifacts so far, by name (``stage_io.step_artifacts``): a stage task reads the
ones its stage reads and returns them all plus the ones it wrote, so the workflow chains the
stages without taking promises apart."""


def _run_stage(
    spec: RunSpec, config_yaml: str, stage: str, step: int, state: ArtifactRef, refs: Refs
) -> Refs:
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, {"state": state, **refs}, f"step {step} {stage}: input")
    usage = UsageLog(io.store, spec.run_id)
    return {**refs, **stage_io.run_stage(cfg, io, stage, state, step, refs, usage)}


@task(**GPU_TASK)
@infrastructure_is_recoverable()
def gpu_stage(
    spec: RunSpec, config_yaml: str, stage: str, step: int, state: ArtifactRef, refs: Refs
) -> Refs:
    """A stage of a training step on a GPU pod (``stage_io.METHODS``; the policy's passes)."""
    return _run_stage(spec, config_yaml, stage, step, state, refs)


@task(**CPU_TASK)
@infrastructure_is_recoverable()
def cpu_stage(
    spec: RunSpec, config_yaml: str, stage: str, step: int, state: ArtifactRef, refs: Refs
) -> Refs:
    """A stage of a training step on a CPU pod (``stage_io.METHODS``)."""
    return _run_stage(spec, config_yaml, stage, step, state, refs)


STAGE_TASKS = {
    s.name: gpu_stage if s.device == "gpu" else cpu_stage
    for method in stage_io.METHODS.values()
    for s in method.stages
}
"""The task that runs each stage of every method (``stage_io.METHODS``), by the stage's pod
kind (the stage's name is an input, and the node's name in the workflow)."""


@task(**GPU_TASK)
@infrastructure_is_recoverable()
def rollout_shard(
    spec: RunSpec, config_yaml: str, step: int, state: ArtifactRef, shard: int, n_shards: int
) -> Refs:
    """The rollout stage for one record shard (the remote fan-out; ``gather_rollouts`` joins
    them)."""
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, {"state": state}, f"step {step} rollout shard {shard}: input")
    usage = UsageLog(io.store, spec.run_id)
    return stage_io.run_stage(
        cfg, io, "rollout", state, step, {}, usage, shard=shard, n_shards=n_shards
    )


@task(**CPU_TASK)
@infrastructure_is_recoverable()
def gather_rollouts(spec: RunSpec, config_yaml: str, shards: list[Refs]) -> Refs:
    """Concatenate shard tables in shard order (validated)."""
    cfg, io = load(spec, config_yaml)
    for i, refs in enumerate(shards):
        require_stored(io.store, refs, f"rollout shard {i}")
    return stage_io.concat_rollouts(cfg, io, shards)
