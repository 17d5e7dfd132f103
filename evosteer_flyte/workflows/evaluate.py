"""The evaluate workflow: a checkpoint × benchmarks × runs → means ± sample std and group
averages, stored as an artifact and logged to one MLflow run.

With no benchmarks given, the six simulated families are evaluated on the sim suite's held-out
records (results are SIMULATED); real benchmarks come as ``name`` plus a JSONL file path. Each
benchmark is read and validated once, here, and stored as a task table; the evaluation tasks
get it by ref and are cached on its hash, so new data under an old path is evaluated anew.

``rows`` (docs/paradigms.md) compares the checkpoint with the untrained architecture, the
frozen executor and the fixed paradigms on the same records and seeds: one cached task per
row × benchmark, the offline workflow search first when ``paradigm:searched`` is asked for
(``search``: its settings), and one summary with each row's token cost. No rows: the
checkpoint alone, as before.
"""

import typing
from typing import Any

from flytekit import dynamic

from evosteer_core.episode.records import FAMILIES
from evosteer_core.evaluation.rollouts import stage_benchmark_records
from evosteer_core.evaluation.rows import parse_rows
from evosteer_core.evaluation.tables import RUNS
from evosteer_core.infra.artifacts import ArtifactRef, open_store
from evosteer_core.infra.config import config_from_dict
from evosteer_core.infra.configio import parse_yaml
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.evaluate import (
    evaluate_benchmark,
    evaluate_row_task,
    search_paradigm_workflows,
    summarize_evaluation,
    summarize_row_evaluation,
)
from evosteer_flyte.tasks.resources import CPU_IMAGE, LIGHT_RESOURCES, RETRIES
from evosteer_flyte.tasks.spec import RunSpec, make_spec
from evosteer_flyte.tasks.tracking_tasks import end_tracking, start_tracking


class EvaluateOutputs(typing.NamedTuple):
    table: ArtifactRef
    mlflow_run: str


@dynamic(
    container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES, retries=RETRIES
)
@infrastructure_is_recoverable()
def evaluate(
    config_yaml: str,
    state: ArtifactRef,
    benchmarks: list[str] = [],  # noqa: B006
    paths: list[str] = [],  # noqa: B006
    runs: int = RUNS,
    rows: list[str] = [],  # noqa: B006
    search: dict[str, int] = {},  # noqa: B006
) -> EvaluateOutputs:
    """``paths[i]`` is the file of ``benchmarks[i]`` ('' or absent = a sim family); ``rows``:
    evaluation row names (none: the checkpoint alone); ``search``: the search settings of
    ``paradigm:searched`` (``paradigms.searched.SearchSettings``, defaults for missing keys)."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    config_yaml = cfg.to_yaml()
    names = list(benchmarks) or list(FAMILIES)
    files = list(paths) + [""] * (len(names) - len(paths))
    if len(files) != len(names):
        raise ValueError(f"{len(paths)} paths for {len(names)} benchmarks")
    spec = make_spec(cfg)
    store = open_store(cfg.store.root, cfg.store.s3_endpoint)
    tables = [stage_benchmark_records(cfg, store, b, p) for b, p in zip(names, files, strict=True)]
    mlflow_run = start_tracking(spec=spec, config_yaml=config_yaml, workflow="evaluate")
    if rows:
        table = _rows(spec, config_yaml, mlflow_run, state, names, tables, runs, rows, search)
        done = end_tracking(spec=spec, config_yaml=config_yaml, mlflow_run=mlflow_run, state=state)
        table >> done
        return table, done
    scores = [
        evaluate_benchmark(
            spec=spec, config_yaml=config_yaml, state=state, benchmark=b, records=t, runs=runs
        )
        for b, t in zip(names, tables, strict=True)
    ]
    table = summarize_evaluation(
        spec=spec,
        config_yaml=config_yaml,
        mlflow_run=mlflow_run,
        state=state,
        benchmarks=names,
        scores=scores,
    )
    done = end_tracking(spec=spec, config_yaml=config_yaml, mlflow_run=mlflow_run, state=state)
    table >> done  # close the MLflow run only after the table is logged
    return table, done


def _rows(
    spec: RunSpec,
    config_yaml: str,
    mlflow_run: Any,
    state: ArtifactRef,
    names: list[str],
    tables: list[ArtifactRef],
    runs: int,
    rows: list[str],
    search: dict[str, int],
) -> Any:
    """The row-major row × benchmark tasks and their summary (``mlflow_run`` and the result
    are promises of the dynamic workflow)."""
    names_rows = parse_rows(rows)
    searched: dict[str, Any] = {}
    if "paradigm:searched" in names_rows:
        found = search_paradigm_workflows(spec=spec, config_yaml=config_yaml, settings=search)
        searched = {"searched": found}
    outs = [
        evaluate_row_task(
            spec=spec,
            config_yaml=config_yaml,
            state=state,
            benchmark=b,
            records=t,
            runs=runs,
            row=row,
            searched=searched if row == "paradigm:searched" else {},
        )
        for row in names_rows
        for b, t in zip(names, tables, strict=True)
    ]
    return summarize_row_evaluation(
        spec=spec,
        config_yaml=config_yaml,
        mlflow_run=mlflow_run,
        state=state,
        benchmarks=names,
        rows=names_rows,
        tables=outs,
    )
