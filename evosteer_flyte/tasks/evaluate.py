"""Evaluation tasks: one benchmark (a stored task table) × N runs of a frozen checkpoint, and the
summary table."""

from flytekit import Cache, Deck, task

from evosteer_core.episode.world import stored_records
from evosteer_core.evaluation.rollouts import benchmark_scores
from evosteer_core.evaluation.tables import summarize
from evosteer_core.infra.artifacts import ArtifactRef, put_json
from evosteer_core.infra.tracking import registered_model_name, tag_registered_adapters
from evosteer_core.pipeline.report import evaluation_deck_html
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.resources import (
    CACHE_VERSION,
    CPU_IMAGE,
    GPU_ACCELERATOR,
    GPU_IMAGE,
    GPU_RESOURCES,
    LIGHT_RESOURCES,
    RETRIES,
)
from evosteer_flyte.tasks.spec import RunSpec, load, require_stored
from evosteer_flyte.tasks.tracking_tasks import DECK, _tracker


@task(
    cache=Cache(version=CACHE_VERSION, ignored_inputs=("config_yaml",)),
    retries=RETRIES,
    container_image=GPU_IMAGE,
    requests=GPU_RESOURCES,
    limits=GPU_RESOURCES,
    accelerator=GPU_ACCELERATOR,
)
@infrastructure_is_recoverable()
def evaluate_benchmark(
    spec: RunSpec,
    config_yaml: str,
    state: ArtifactRef,
    benchmark: str,
    records: ArtifactRef,
    runs: int,
) -> list[float]:
    """Mean reward of the frozen π_θ on one benchmark, once per run (run-seeded draws);
    ``records`` is the benchmark's task table in the store, so the cache keys on its hash."""
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, {"state": state, "records": records}, f"evaluate {benchmark}")
    return benchmark_scores(
        cfg, io.get_state(state), benchmark, stored_records(io.store, records), runs
    )


@task(
    retries=RETRIES,
    container_image=CPU_IMAGE,
    requests=LIGHT_RESOURCES,
    limits=LIGHT_RESOURCES,
    **DECK,
)
@infrastructure_is_recoverable()
def summarize_evaluation(
    spec: RunSpec,
    config_yaml: str,
    mlflow_run: str,
    state: ArtifactRef,
    benchmarks: list[str],
    scores: list[list[float]],
) -> ArtifactRef:
    """The means ± std table, stored as JSON and logged to MLflow (metrics and the table); the
    results are also set as tags on the registered adapter versions of this checkpoint. Its
    Deck shows the table and a bar plot of it."""
    cfg, io = load(spec, config_yaml)
    table = summarize(dict(zip(benchmarks, scores, strict=True)))
    Deck("Evaluation", evaluation_deck_html(table, state.sha256))
    ref = put_json(io.store, {"checkpoint": state.sha256, **table.to_dict()}, "evaluation.json")
    tracker = _tracker(config_yaml, spec, mlflow_run)
    if tracker is not None:
        metrics = {}
        for s in (*table.benchmarks, *table.groups):
            key = s.name.replace(" ", "_")
            metrics.update({f"eval.{key}.mean": s.mean, f"eval.{key}.std": s.std})
        tracker.log_step(0, metrics)
        tracker.client.log_text(tracker.run_id, table.markdown(), "evaluation.md")
        tracker.client.log_text(tracker.run_id, io.store.get_bytes(ref).decode(), "evaluation.json")
        tracker.set_tags({"sha256.evaluation": ref.sha256, "sha256.checkpoint": state.sha256})
        tag_registered_adapters(cfg, registered_model_name(cfg), state.sha256, metrics)
    return ref
