"""The evaluate workflow: a checkpoint × benchmarks × runs → means ± sample std and group
averages, stored as an artifact and logged to one MLflow run.

With no benchmarks given, the six simulated families are evaluated on the sim suite's held-out
records (results are SIMULATED); real benchmarks come as ``name`` plus a JSONL file path.
"""

import typing

from flytekit import dynamic

from evosteer_core.episode.records import FAMILIES
from evosteer_core.evaluation.tables import RUNS
from evosteer_core.infra.artifacts import ArtifactRef
from evosteer_core.infra.config import config_from_dict
from evosteer_core.infra.configio import parse_yaml
from evosteer_flyte.tasks.evaluate import evaluate_benchmark, summarize_evaluation
from evosteer_flyte.tasks.resources import CPU_IMAGE, LIGHT_RESOURCES, RETRIES
from evosteer_flyte.tasks.spec import make_spec
from evosteer_flyte.tasks.tracking_tasks import end_tracking, start_tracking


class EvaluateOutputs(typing.NamedTuple):
    table: ArtifactRef
    mlflow_run: str


@dynamic(
    container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES, retries=RETRIES
)
def evaluate(
    config_yaml: str,
    state: ArtifactRef,
    benchmarks: list[str] = [],  # noqa: B006
    paths: list[str] = [],  # noqa: B006
    runs: int = RUNS,
) -> EvaluateOutputs:
    """``paths[i]`` is the file of ``benchmarks[i]`` ('' or absent = a sim family)."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    config_yaml = cfg.to_yaml()
    names = list(benchmarks) or list(FAMILIES)
    files = list(paths) + [""] * (len(names) - len(paths))
    if len(files) != len(names):
        raise ValueError(f"{len(paths)} paths for {len(names)} benchmarks")
    spec = make_spec(cfg)
    mlflow_run = start_tracking(spec=spec, config_yaml=config_yaml, workflow="evaluate")
    scores = [
        evaluate_benchmark(
            spec=spec, config_yaml=config_yaml, state=state, benchmark=b, path=p, runs=runs
        )
        for b, p in zip(names, files, strict=True)
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
