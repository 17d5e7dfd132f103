"""Remote readiness: the workflows compile for a Flyte cluster without one.

Every task is serialized as ``pyflyte package`` does with no ``--image`` flags (each task
names its image in full: evosteer_flyte/images.py), and the dynamic bodies of the 240-step
train workflow of configs/paper.yaml are compiled the way the cluster compiles them at run
time; the compiled task templates and node counts are checked.
"""

from collections import OrderedDict
from pathlib import Path

import pytest
from flytekit.configuration import ImageConfig, SerializationSettings
from flytekit.core.base_task import PythonTask
from flytekit.core.context_manager import ExecutionState, FlyteContextManager
from flytekit.models.task import Resources
from flytekit.tools.translator import get_serializable

from evosteer_core.experiment.cells import experiment_cells
from evosteer_core.infra.artifacts import ArtifactRef
from evosteer_core.infra.config import load_config
from evosteer_flyte.tasks import evaluate as eval_tasks
from evosteer_flyte.tasks import experiment as experiment_tasks
from evosteer_flyte.tasks import replay as replay_tasks
from evosteer_flyte.tasks import spec as run_spec
from evosteer_flyte.tasks import step_tasks, tracking_tasks
from evosteer_flyte.tasks.resources import (
    CACHE_VERSION,
    CPU_IMAGE,
    EVALUATION_CACHE_VERSION,
    GPU_IMAGE,
)
from evosteer_flyte.tasks.spec import make_spec
from evosteer_flyte.workflows import evaluate as eval_wf
from evosteer_flyte.workflows import experiment as experiment_wf
from evosteer_flyte.workflows import replay as replay_wf
from evosteer_flyte.workflows import train as train_wf

R = Resources.ResourceName
ROOT = Path(__file__).resolve().parents[1]
PAPER = load_config(ROOT / "configs" / "paper.yaml")
GPU_TASKS = {
    "gpu_stage",
    "rollout_shard",
    "evaluate_benchmark",
    "evaluate_cell",
    "evaluate_row_task",
    "warm_start",
    "replay_step",
}
STATE = ArtifactRef("s3://evosteer-artifacts/paper/objects/00/" + "0" * 64, "0" * 64)


@pytest.fixture(autouse=True)
def _no_store(monkeypatch):
    """Compiling must not reach the paper config's S3 bucket or its benchmark files (they are
    in the store of a real launch): the store id and the staged tables are stand-ins."""
    from evosteer_flyte.tasks import spec as spec_module

    monkeypatch.setattr(spec_module, "store_id", lambda store: "paper-store")
    monkeypatch.setattr(eval_wf, "open_store", lambda root, endpoint=None: None)
    monkeypatch.setattr(eval_wf, "stage_benchmark_records", lambda cfg, store, b, p: STATE)


def _settings() -> SerializationSettings:
    return SerializationSettings(
        image_config=ImageConfig.auto_default_image(),  # what pyflyte uses without flags
        project="evosteer",
        domain="development",
        version="v1",
    )


def _all_tasks() -> list[PythonTask]:
    found = {}
    modules = (step_tasks, tracking_tasks, eval_tasks, replay_tasks, experiment_tasks)
    for module in (*modules, train_wf, eval_wf, experiment_wf):
        for obj in vars(module).values():
            if isinstance(obj, PythonTask):
                found[obj.name] = obj
    return list(found.values())


def _short(name: str) -> str:
    """Task name without its module (a map task's template is named after its task)."""
    short = name.rsplit(".", 1)[-1]
    return "rollout_shard" if short.startswith("map_rollout_shard_") else short


def _requests(template) -> dict[int, str]:
    return {r.name: r.value for r in template.container.resources.requests}


def _check_template(template) -> None:
    name = _short(template.id.name)
    image = template.container.image
    assert "{{" not in image, name  # a full reference: registering needs no --image flags
    if name in GPU_TASKS:
        assert image == GPU_IMAGE, name
        assert template.extended_resources.gpu_accelerator.device == "nvidia-h100", name
        assert _requests(template)[R.GPU] == "1", name
    else:
        assert image == CPU_IMAGE, name
        assert (
            not template.extended_resources
            or not template.extended_resources.gpu_accelerator.device
        )
        assert R.GPU not in _requests(template), name
    assert {R.CPU, R.MEMORY} <= set(_requests(template)), name
    assert template.metadata.retries.retries >= 1, name


def test_every_task_serializes_with_its_image_resources_and_accelerator():
    tasks = _all_tasks()
    assert {_short(t.name) for t in tasks} >= GPU_TASKS | {
        "init_run",
        "cpu_stage",
        "gather_rollouts",
        "record_step",
        "record_init",
        "start_tracking",
        "end_tracking",
        "summarize_evaluation",
        "train",
        "train_chunk",
        "evaluate",
        "experiment",
        "experiment_row",
        "experiment_cell",
        "experiment_cell_run",
        "record_cell",
        "summarize_experiment",
    }
    for t in tasks:
        spec = get_serializable(OrderedDict(), _settings(), t)
        _check_template(spec.template)
        if _short(t.name) in {
            "gpu_stage",
            "cpu_stage",
            "rollout_shard",
            "init_run",
            "evaluate_cell",
        }:
            assert spec.template.metadata.discoverable, t.name  # cached
            assert spec.template.metadata.discovery_version.startswith("0.1.0-"), t.name


def test_replay_workflow_compiles():
    spec = get_serializable(OrderedDict(), _settings(), replay_wf.replay)
    assert [_short(n.task_node.reference_id.name) for n in spec.template.nodes] == ["replay_step"]


def _compile_dynamic(dyn, **kwargs):
    """Compile a dynamic body as a fresh pod does (flytekit caches the compiled workflow)."""
    dyn._wf = None
    ctx = FlyteContextManager.current_context().with_serialization_settings(_settings())
    with FlyteContextManager.with_context(ctx) as ctx:
        es = ctx.execution_state.with_params(mode=ExecutionState.Mode.TASK_EXECUTION)
        with FlyteContextManager.with_context(ctx.with_execution_state(es)) as ctx:
            return dyn.compile_into_workflow(ctx, dyn._task_function, **kwargs)


def test_240_step_train_stays_within_the_per_dynamic_node_guidance(monkeypatch):
    assert PAPER.train.steps == 240
    # the body stages and checks the benchmark files first; they are not in this checkout
    staged, checked = [], []
    monkeypatch.setattr(run_spec, "stage_data", lambda cfg: staged.append(cfg) or cfg)
    monkeypatch.setattr(train_wf, "load_records", checked.append)
    top = _compile_dynamic(train_wf.train, config_yaml=PAPER.to_yaml(), steps=0, rollout_shards=4)
    assert [c.data for c in staged] == [c.data for c in checked] == [PAPER.data]
    assert len(top.nodes) == 1  # no policy.init: the run itself, no warm_start task
    outer = _compile_dynamic(
        train_wf.train_run, config_yaml=PAPER.to_yaml(), warm=None, rollout_shards=4
    )
    chunks = train_wf.chunks(240)
    assert len(outer.nodes) == len(chunks) + train_wf.OUTER_NODES
    assert len(outer.nodes) < train_wf.MAX_NODES_PER_DYNAMIC
    assert chunks[0] == (1, train_wf.CHUNK_STEPS) and chunks[-1][1] == 240
    assert all(b - a + 1 <= 10 for a, b in chunks)
    for t in outer.tasks:
        _check_template(t)

    spec = make_spec(PAPER)
    first, last = chunks[0]
    inner = _compile_dynamic(
        train_wf.train_chunk,
        spec=spec,
        config_yaml=PAPER.to_yaml(),
        mlflow_run="r",
        first=first,
        last=last,
        state=STATE,
        rollout_shards=4,
    )
    assert len(inner.nodes) == train_wf.CHUNK_STEPS * train_wf.NODES_PER_STEP["sharded"]
    assert len(inner.nodes) < train_wf.MAX_NODES_PER_DYNAMIC
    kinds = [n.array_node is not None for n in inner.nodes]
    assert sum(kinds) == train_wf.CHUNK_STEPS  # one map_task (array node) per step
    for t in inner.tasks:
        _check_template(t)
    for n in inner.nodes:
        if n.array_node is not None:
            _check_template(
                next(t for t in inner.tasks if t.id == n.array_node.node.task_node.reference_id)
            )


@pytest.mark.parametrize("shards", [1])
def test_local_chunk_has_one_rollout_task_per_step(shards):
    inner = _compile_dynamic(
        train_wf.train_chunk,
        spec=make_spec(PAPER),
        config_yaml=PAPER.to_yaml(),
        mlflow_run="",
        first=1,
        last=3,
        state=STATE,
        rollout_shards=shards,
    )
    assert len(inner.nodes) == 3 * train_wf.NODES_PER_STEP["local"]


def test_evaluate_dynamic_compiles():
    out = _compile_dynamic(
        eval_wf.evaluate,
        config_yaml=PAPER.to_yaml(),
        state=STATE,
        benchmarks=[],
        paths=[],
        runs=5,
        rows=[],
        search={},
    )
    assert len(out.nodes) == 6 + 3  # six families, summary, start and end of tracking
    for t in out.tasks:
        _check_template(t)


def _table2_like(rows: int, seeds: int):
    """The paper config with a Table-2-sized experiment: ``rows`` rows (one trained per
    objective, the rest evaluation-only) × ``seeds`` seeds."""
    objectives = ["anchortb", "ppo", "grpo", "tb", "tempered_tb"]
    spec = [{"name": o, "set": {"train.objective": o}} for o in objectives]
    spec += [{"name": f"untrained {k}", "eval": "untrained"} for k in range(rows - len(spec))]
    return load_config(
        ROOT / "configs" / "paper.yaml",
        {"experiment": {"rows": spec, "seeds": list(range(seeds))}},
    )


def test_a_table2_sized_experiment_stays_within_the_per_dynamic_node_guidance():
    cfg = _table2_like(rows=17, seeds=3)
    outer = _compile_dynamic(experiment_wf.experiment, config_yaml=cfg.to_yaml())
    assert len(outer.nodes) == 17 + 3 < train_wf.MAX_NODES_PER_DYNAMIC
    row = _compile_dynamic(
        experiment_wf.experiment_row, config_yaml=cfg.to_yaml(), row="ppo", mlflow_run="r"
    )
    assert len(row.nodes) == 3  # one cell per seed
    cell = next(c for c in experiment_cells(cfg) if c.row.name == "ppo")
    args = dict(row="ppo", seed=cell.seed, runs=5, mlflow_run="r")
    outer_cell = _compile_dynamic(
        experiment_wf.experiment_cell,
        config_yaml=cell.config.to_yaml(),
        evaluation="checkpoint",
        **args,
    )
    assert len(outer_cell.nodes) <= 2  # the warm start (with policy.init) and the cell's run
    searched = _compile_dynamic(
        experiment_wf.experiment_cell_run,
        config_yaml=cell.config.to_yaml(),
        warm=None,
        evaluation="paradigm:searched",
        **args,
    )
    names = [_short(n.task_node.reference_id.name) for n in searched.nodes if n.task_node]
    assert names == ["init_run", "search_paradigm_workflows", "evaluate_cell", "record_cell"]
    for evaluation, first in (("checkpoint", "train"), ("untrained", "init_run")):
        run = _compile_dynamic(
            experiment_wf.experiment_cell_run,
            config_yaml=cell.config.to_yaml(),
            warm=None,
            evaluation=evaluation,
            **args,
        )
        names = [_short(n.task_node.reference_id.name) for n in run.nodes if n.task_node]
        assert names == [first, "evaluate_cell", "record_cell"]
        for t in run.tasks:
            _check_template(t)
    for t in (*outer.tasks, *row.tasks, *outer_cell.tasks):
        _check_template(t)


EVALUATION_TASKS = {"evaluate_benchmark", "evaluate_row_task", "evaluate_cell"}


def test_evaluations_have_their_own_cache_version_and_every_other_cached_task_the_common_one():
    """An evaluation-only change (``EVALUATION_VERSION``) recomputes evaluations, not training;
    a ``CODE_VERSION`` bump reaches both (the evaluation version extends the common one)."""
    versions = {}
    for t in _all_tasks():
        meta = get_serializable(OrderedDict(), _settings(), t).template.metadata
        if meta.discoverable:
            versions[_short(t.name)] = meta.discovery_version
    assert set(versions) >= EVALUATION_TASKS
    assert {"gpu_stage", "cpu_stage", "rollout_shard", "init_run"} <= set(versions)
    for name, version in versions.items():
        expected = EVALUATION_CACHE_VERSION if name in EVALUATION_TASKS else CACHE_VERSION
        assert version == expected, name
    assert EVALUATION_CACHE_VERSION.startswith(CACHE_VERSION + "-")
