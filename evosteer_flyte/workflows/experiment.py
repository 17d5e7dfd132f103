"""The experiment workflow: rows × seeds of independent cached sub-runs, then one table.

``experiment`` (a ``@dynamic``) opens the experiment's MLflow run, then one ``experiment_row``
(also a ``@dynamic``) per row, one ``experiment_cell`` per seed: its warm start (when
``policy.init`` asks for one; a dynamic level of its own, so the ref is a value below it),
then the cell's run is trained (the train workflow, so its steps are the same cached stage
tasks) or only initialised (an evaluation-only row), evaluated (``evaluate_cell``, cached) and
logged as a child MLflow run. ``summarize_experiment``
builds the table from every cell. Each cell is an ordinary run, so re-running a crashed
experiment executes only the cells (and steps) that are missing; on a cluster the rows run in
parallel. Nodes: the rows plus 3 at the top; one per seed in a row; at most 2 and 3 in a
cell's two levels (docs/experiments.md).

    pyflyte run evosteer_flyte/workflows/experiment.py experiment --config_yaml "$(cat configs/table2-sim.yaml)"
"""

import dataclasses
import typing

from flytekit import dynamic

from evosteer_core.experiment.cells import Cell, experiment_cells, experiment_id
from evosteer_core.infra.artifacts import ArtifactRef
from evosteer_core.infra.config import RunConfig, config_from_dict
from evosteer_core.infra.configio import parse_yaml
from evosteer_core.training.warm_start import with_warm_start
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.evaluate import search_paradigm_workflows
from evosteer_flyte.tasks.experiment import evaluate_cell, record_cell, summarize_experiment
from evosteer_flyte.tasks.resources import CPU_IMAGE, LIGHT_RESOURCES, RETRIES
from evosteer_flyte.tasks.spec import make_spec
from evosteer_flyte.tasks.step_tasks import init_run
from evosteer_flyte.tasks.tracking_tasks import end_tracking, start_tracking
from evosteer_flyte.workflows.train import train, warm_start_of

SEARCHED = "paradigm:searched"
"""The row that needs the offline workflow search first (docs/paradigms.md)."""

DYNAMIC = dict(
    container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES, retries=RETRIES
)


class RowOutputs(typing.NamedTuple):
    cells: list[ArtifactRef]
    costs: list[dict[str, float]]


class ExperimentOutputs(typing.NamedTuple):
    experiment_id: str
    mlflow_run: str
    table: ArtifactRef


class CellOutputs(typing.NamedTuple):
    trajectories: ArtifactRef
    costs: dict[str, float]


@dynamic(**DYNAMIC)
@infrastructure_is_recoverable()
def experiment_row(config_yaml: str, row: str, mlflow_run: str) -> RowOutputs:
    """Every seed of one row, each an ``experiment_cell``."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    cells, costs = [], []
    for cell in (c for c in experiment_cells(cfg) if c.row.name == row):
        out = run_cell(cfg, cell, mlflow_run)
        cells.append(out.trajectories)
        costs.append(out.costs)
    return cells, costs


def run_cell(cfg: RunConfig, cell: Cell, mlflow_run: str) -> CellOutputs:
    """``experiment_cell`` of one cell of ``cfg``'s experiment: how a row runs its seeds, and
    how ``evosteer experiment --jobs`` runs one cell alone in a worker (its tasks then are
    cache hits when the experiment runs the row)."""
    return experiment_cell(
        config_yaml=cell.config.to_yaml(),
        row=cell.row.name,
        seed=cell.seed,
        evaluation=cell.row.eval,
        runs=cfg.experiment.runs,
        mlflow_run=mlflow_run,
    )


@dynamic(**DYNAMIC)
@infrastructure_is_recoverable()
def experiment_cell(
    config_yaml: str, row: str, seed: int, evaluation: str, runs: int, mlflow_run: str
) -> CellOutputs:
    """One cell: its warm start first when the config asks for one (the same cached task the
    train workflow runs), then :func:`experiment_cell_run`."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    return experiment_cell_run(
        config_yaml=config_yaml,
        warm=warm_start_of(cfg, config_yaml),
        row=row,
        seed=seed,
        evaluation=evaluation,
        runs=runs,
        mlflow_run=mlflow_run,
    )


@dynamic(**DYNAMIC)
@infrastructure_is_recoverable()
def experiment_cell_run(
    config_yaml: str,
    warm: ArtifactRef | None,
    row: str,
    seed: int,
    evaluation: str,
    runs: int,
    mlflow_run: str,
) -> CellOutputs:
    """Train the cell's run (the train workflow) or only initialise it (an evaluation-only
    row), evaluate it, record it as a child MLflow run."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    if warm is not None:
        cfg = with_warm_start(cfg, warm)
        config_yaml = cfg.to_yaml()
    spec = make_spec(cfg)
    if evaluation == "checkpoint":
        state = train(config_yaml=config_yaml).state
    else:
        state = init_run(spec=spec, config_yaml=config_yaml)
    searched = {}
    if evaluation == SEARCHED:  # the offline search on the cell's training tasks (cached)
        searched["searched"] = search_paradigm_workflows(
            spec=spec, config_yaml=config_yaml, settings={}
        )
    result = evaluate_cell(
        spec=spec,
        config_yaml=config_yaml,
        state=state,
        evaluation=evaluation,
        runs=runs,
        searched=searched,
    )
    trajectories = record_cell(
        spec=spec,
        config_yaml=config_yaml,
        parent_run=mlflow_run,
        row=row,
        seed=seed,
        trajectories=result.trajectories,
    )
    return trajectories, result.costs


@dynamic(**DYNAMIC)
@infrastructure_is_recoverable()
def experiment(config_yaml: str) -> ExperimentOutputs:
    """Run every (row, seed) cell of the config's ``experiment`` section and the table."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    experiment_cells(cfg)  # every cell's config is checked before anything runs
    config_yaml = cfg.to_yaml()
    spec = dataclasses.replace(make_spec(cfg), run_id=experiment_id(cfg))
    mlflow_run = start_tracking(spec=spec, config_yaml=config_yaml, workflow="experiment")
    cells: list = []
    costs: list = []
    for row in cfg.experiment.rows:
        out = experiment_row(config_yaml=config_yaml, row=row.name, mlflow_run=mlflow_run)
        cells.append(out.cells)
        costs.append(out.costs)
    table = summarize_experiment(
        spec=spec, config_yaml=config_yaml, mlflow_run=mlflow_run, cells=cells, costs=costs
    )
    done = end_tracking(spec=spec, config_yaml=config_yaml, mlflow_run=mlflow_run, state=table)
    table >> done
    return spec.run_id, done, table
