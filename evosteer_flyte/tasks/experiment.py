"""Experiment tasks: evaluate one cell (cached), record it as a child MLflow run, and build the
table (docs/experiments.md). The algorithm is in :mod:`evosteer_core.experiment`."""

import typing

from flytekit import Deck, task

from evosteer_core.experiment.cells import cell_trajectories, training_costs
from evosteer_core.experiment.report import store_experiment
from evosteer_core.experiment.table import cell_metrics
from evosteer_core.infra.artifacts import ArtifactRef, get_json
from evosteer_core.infra.tracking import log_experiment_cell
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.evaluate import EVALUATION_TASK
from evosteer_flyte.tasks.resources import (
    CPU_IMAGE,
    LIGHT_RESOURCES,
    RETRIES,
)
from evosteer_flyte.tasks.spec import RunSpec, load, require_stored
from evosteer_flyte.tasks.tracking_tasks import _tracker


class CellResult(typing.NamedTuple):
    trajectories: ArtifactRef
    costs: dict[str, float]


@task(**EVALUATION_TASK)
@infrastructure_is_recoverable()
def evaluate_cell(
    spec: RunSpec,
    config_yaml: str,
    state: ArtifactRef,
    evaluation: str,
    runs: int,
    searched: dict[str, ArtifactRef],
) -> CellResult:
    """The cell's frozen row on every held-out record, ``runs`` times (its trajectories
    table), and a trained cell's training cost figures; ``searched`` holds the
    searched-workflow artifact of a ``paradigm:searched`` row (else it is empty)."""
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, {"state": state, **searched}, f"evaluate cell {spec.run_id}")
    workflows = get_json(io.store, searched["searched"]) if searched else None
    trajectories = cell_trajectories(cfg, io.get_state(state), evaluation, runs, workflows)
    ref = io.put_table(trajectories, "cell_trajectories")
    costs = training_costs(io, cfg, spec.run_id) if evaluation == "checkpoint" else {}
    return ref, costs


@task(retries=RETRIES, container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES)
@infrastructure_is_recoverable()
def record_cell(
    spec: RunSpec,
    config_yaml: str,
    parent_run: str,
    row: str,
    seed: int,
    trajectories: ArtifactRef,
) -> ArtifactRef:
    """Log the cell as a child of the experiment's MLflow run (its per-family means); pass the
    trajectories on."""
    cfg, io = load(spec, config_yaml)
    if parent_run:
        metrics = cell_metrics(io.get_table(trajectories))
        log_experiment_cell(cfg, parent_run, spec.run_id, row, seed, metrics)
    return trajectories


@task(
    retries=RETRIES,
    container_image=CPU_IMAGE,
    requests=LIGHT_RESOURCES,
    limits=LIGHT_RESOURCES,
    enable_deck=True,
)
@infrastructure_is_recoverable()
def summarize_experiment(
    spec: RunSpec,
    config_yaml: str,
    mlflow_run: str,
    cells: list[list[ArtifactRef]],
    costs: list[list[dict[str, float]]],
) -> ArtifactRef:
    """The experiment table from every cell (``cells[i][j]``: row i, seed j): stored as JSON, markdown and HTML, shown as a Deck and logged to the
    experiment's MLflow run."""
    cfg, io = load(spec, config_yaml)
    flat = [ref for row in cells for ref in row]
    require_stored(io.store, {f"cell {i}": c for i, c in enumerate(flat)}, "summarize")
    stored = store_experiment(cfg, io, flat, [c for row in costs for c in row])
    Deck("experiment", stored.html)
    tracker = _tracker(config_yaml, spec, mlflow_run)
    if tracker is not None:
        tracker.client.log_text(tracker.run_id, stored.markdown, "experiment.md")
        tracker.client.log_text(tracker.run_id, stored.html, "experiment.html")
        tracker.set_tags({"sha256.experiment": stored.ref.sha256})
    return stored.ref
