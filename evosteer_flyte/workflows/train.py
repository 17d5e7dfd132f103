"""The train workflow: ``steps`` training steps unrolled as chunks of dynamic sub-workflows.

``train`` (a ``@dynamic``) stages the data and, with ``policy.init``, runs the cached
``warm_start`` task (docs/warm_start.md); ``train_run`` (also a ``@dynamic``, so the warm
start's ref is a value there and goes into the config) runs ``init_run``, opens the MLflow
run, then one ``train_chunk`` (a ``@dynamic`` too) per :data:`CHUNK_STEPS` steps. Every stage task is cached, so re-running a
finished, crashed or extended run executes only what is missing: that is resume. Locally one
rollout task runs all records; remotely (``rollout_shards`` > 1) rollouts fan out with
``map_task`` over record shards. Benchmark files are read once, here, and passed on as task
tables in the store (``world.stage_data``): no task reads a file path.

    pyflyte run evosteer_flyte/workflows/train.py train --config_yaml "$(cat configs/tiny-sim.yaml)" --steps 3
"""

import functools
import typing

from flytekit import dynamic, map_task
from flytekit.core.promise import Promise

from evosteer_core.episode.world import load_records
from evosteer_core.infra.artifacts import ArtifactRef, open_store, store_id
from evosteer_core.infra.config import RunConfig, config_from_dict
from evosteer_core.infra.configio import parse_yaml
from evosteer_core.pipeline.costs import require_priced
from evosteer_core.pipeline.stage_io import method_of
from evosteer_core.training.warm_start import warm_start_key, with_warm_start
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.resources import CPU_IMAGE, LIGHT_RESOURCES, RETRIES
from evosteer_flyte.tasks.spec import RunSpec, make_spec, parsed_config, train_config
from evosteer_flyte.tasks.step_tasks import STAGE_TASKS, gather_rollouts, init_run, rollout_shard
from evosteer_flyte.tasks.tracking_tasks import (
    end_tracking,
    record_init,
    record_step,
    start_tracking,
)
from evosteer_flyte.tasks.warm_start import warm_start

MAX_NODES_PER_DYNAMIC = 50
"""flytekit's guidance for one dynamic workflow's node count."""

STAGE_NODES = 6
"""rescore, value, update, validation, checkpoint, record_step."""

NODES_PER_STEP = {"local": STAGE_NODES + 1, "sharded": STAGE_NODES + 2}
"""A step's nodes: the stages plus one rollout task, or a map_task and ``gather_rollouts``."""

OUTER_NODES = 4
"""init_run, record_init, start_tracking, end_tracking (besides the chunks)."""

CHUNK_STEPS = min(10, (MAX_NODES_PER_DYNAMIC - 2) // NODES_PER_STEP["sharded"])
"""Steps per chunk: at most 10, and few enough that a sharded chunk stays under the guidance."""


class TrainOutputs(typing.NamedTuple):
    run_id: str
    mlflow_run: str
    state: ArtifactRef


def chunks(steps: int) -> list[tuple[int, int]]:
    """(first, last) step of each chunk, 1-based and inclusive."""
    return [(a, min(a + CHUNK_STEPS - 1, steps)) for a in range(1, steps + 1, CHUNK_STEPS)]


@dynamic(
    container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES, retries=RETRIES
)
@infrastructure_is_recoverable()
def train_chunk(
    spec: RunSpec,
    config_yaml: str,
    mlflow_run: str,
    first: int,
    last: int,
    state: ArtifactRef,
    rollout_shards: int,
) -> ArtifactRef:
    """Steps ``first..last``: each step's stage tasks in the order of the method's stage
    table (``stage_io.METHODS``), then its run-index/MLflow record."""
    stages = method_of(parsed_config(config_yaml)[0]).stages
    for step in range(first, last + 1):
        common = dict(spec=spec, config_yaml=config_yaml, step=step, state=state)
        refs: dict = {}
        for stage in stages:  # each stage task returns the step's artifacts so far
            if stage.name == "rollout" and rollout_shards > 1:
                per_shard = map_task(
                    functools.partial(rollout_shard, **common, n_shards=rollout_shards)
                )(shard=list(range(rollout_shards)))
                refs = gather_rollouts(spec=spec, config_yaml=config_yaml, shards=per_shard)
            else:
                refs = STAGE_TASKS[stage.name](**common, stage=stage.name, refs=refs)
                refs = refs.with_overrides(node_name=f"{stage.name}-{step}")
        state = record_step(
            spec=spec, config_yaml=config_yaml, mlflow_run=mlflow_run, step=step, refs=refs
        )
    return state


@dynamic(
    container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES, retries=RETRIES
)
@infrastructure_is_recoverable()
def train(config_yaml: str, steps: int = 0, rollout_shards: int = 1) -> TrainOutputs:
    """Train for ``steps`` steps (0 = the config's ``train.steps``); with ``policy.init`` the
    cached ``warm_start`` task fits the reference prior first."""
    cfg = train_config(config_yaml, steps)
    load_records(cfg)  # every slice is checked before a run is opened or a step runs
    require_priced(cfg, "<config_yaml>")  # a run budget needs every model priced
    config_yaml = cfg.to_yaml()
    warm = warm_start_of(cfg, config_yaml)
    return train_run(config_yaml=config_yaml, warm=warm, rollout_shards=rollout_shards)


def warm_start_of(cfg: RunConfig, config_yaml: str) -> Promise | None:
    """Inside a dynamic: the cached ``warm_start`` node of a config whose ``policy.init``
    asks for a warm start it does not hold yet (the train and experiment workflows), else
    None."""
    if cfg.policy.init is None or cfg.policy.init.ref is not None:
        return None
    store = store_id(open_store(cfg.store.root, cfg.store.s3_endpoint))
    return warm_start(key=warm_start_key(cfg), store=store, config_yaml=config_yaml)


@dynamic(
    container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES, retries=RETRIES
)
@infrastructure_is_recoverable()
def train_run(
    config_yaml: str,
    warm: ArtifactRef | None,
    rollout_shards: int,
) -> TrainOutputs:
    """The run of a staged config (``warm``: the warm start's weights, which go into
    ``policy.init.ref``): init, tracking, then the chunks of steps."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    if warm is not None:
        cfg = with_warm_start(cfg, warm)
        config_yaml = cfg.to_yaml()
    spec = make_spec(cfg)
    mlflow_run = start_tracking(spec=spec, config_yaml=config_yaml, workflow="train")
    state = record_init(
        spec=spec,
        config_yaml=config_yaml,
        state=init_run(spec=spec, config_yaml=config_yaml),
        mlflow_run=mlflow_run,
    )
    for first, last in chunks(cfg.train.steps):
        state = train_chunk(
            spec=spec,
            config_yaml=config_yaml,
            mlflow_run=mlflow_run,
            first=first,
            last=last,
            state=state,
            rollout_shards=rollout_shards,
        )
    return (
        spec.run_id,
        end_tracking(spec=spec, config_yaml=config_yaml, mlflow_run=mlflow_run, state=state),
        state,
    )
