"""Evaluation tasks: one benchmark (a stored task table) × N runs of a frozen checkpoint, and the
summary table; with rows (docs/paradigms.md): the offline workflow search, one row × one
benchmark, and the rows' summary."""

from flytekit import Cache, Deck, task

from evosteer_core.episode.world import stored_records
from evosteer_core.evaluation.rollouts import benchmark_scores, evaluate_row
from evosteer_core.evaluation.row_summary import (
    costs_markdown,
    row_metrics,
    scores_markdown,
    summarize_rows,
)
from evosteer_core.evaluation.rows import load_row_table, store_row_table
from evosteer_core.evaluation.tables import summarize
from evosteer_core.infra.artifacts import ArtifactRef, get_json, put_json
from evosteer_core.infra.tracking import registered_model_name, tag_registered_adapters
from evosteer_core.paradigms.searched import (
    SearchSettings,
    search_run_workflows,
    store_workflows,
)
from evosteer_core.pipeline.report import evaluation_deck_html
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.resources import (
    CACHE_VERSION,
    CPU_IMAGE,
    EVALUATION_CACHE_VERSION,
    LIGHT_RESOURCES,
    RETRIES,
)
from evosteer_flyte.tasks.spec import RunSpec, load, require_stored
from evosteer_flyte.tasks.step_tasks import GPU_TASK
from evosteer_flyte.tasks.tracking_tasks import DECK, _tracker

EVALUATION_TASK = {
    **GPU_TASK,
    "cache": Cache(version=EVALUATION_CACHE_VERSION, ignored_inputs=("config_yaml",)),
}
"""A GPU task that evaluates a frozen checkpoint: cached under the evaluation cache version, so
a change to evaluation alone recomputes evaluations and no training."""


@task(**EVALUATION_TASK)
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


@task(
    cache=Cache(version=CACHE_VERSION, ignored_inputs=("config_yaml",)),
    retries=RETRIES,
    container_image=CPU_IMAGE,
    requests=LIGHT_RESOURCES,
    limits=LIGHT_RESOURCES,
)
@infrastructure_is_recoverable()
def search_paradigm_workflows(
    spec: RunSpec, config_yaml: str, settings: dict[str, int]
) -> ArtifactRef:
    """The offline workflow search on the run's training records (``paradigms.searched``),
    stored content-addressed; cached on the run spec and the search settings."""
    cfg, io = load(spec, config_yaml)
    found = search_run_workflows(cfg, SearchSettings.from_dict(settings))
    return store_workflows(io.store, found)


@task(**EVALUATION_TASK)
@infrastructure_is_recoverable()
def evaluate_row_task(
    spec: RunSpec,
    config_yaml: str,
    state: ArtifactRef,
    benchmark: str,
    records: ArtifactRef,
    runs: int,
    row: str,
    searched: dict[str, ArtifactRef],
) -> ArtifactRef:
    """One evaluation row (``evaluation.rows``) on one benchmark's stored task table, N runs;
    ``searched`` holds the searched-workflow artifact for ``paradigm:searched`` (else empty).
    Returns the stored row table."""
    cfg, io = load(spec, config_yaml)
    require_stored(io.store, {"state": state, "records": records, **searched}, f"row {row}")
    workflows = get_json(io.store, searched["searched"]) if searched else None
    table = evaluate_row(
        cfg, io.get_state(state), benchmark, stored_records(io.store, records), runs, row, workflows
    )
    return store_row_table(io.store, table)


@task(retries=RETRIES, container_image=CPU_IMAGE, requests=LIGHT_RESOURCES, limits=LIGHT_RESOURCES)
@infrastructure_is_recoverable()
def summarize_row_evaluation(
    spec: RunSpec,
    config_yaml: str,
    mlflow_run: str,
    state: ArtifactRef,
    benchmarks: list[str],
    rows: list[str],
    tables: list[ArtifactRef],
) -> ArtifactRef:
    """The rows × benchmarks table and each row's token cost (``evaluation.row_summary``),
    with the refs of the row tables it read (``row_tables``), stored as JSON and logged to
    MLflow; ``tables`` is row-major (every benchmark of the first
    row, then the next). The checkpoint row's results are also set as tags on the registered
    adapter versions of this checkpoint, as a plain evaluation does."""
    cfg, io = load(spec, config_yaml)
    it = iter(tables)
    refs = {r: {b: next(it) for b in benchmarks} for r in rows}
    loaded = {r: {b: load_row_table(io.store, t) for b, t in by.items()} for r, by in refs.items()}
    summary = summarize_rows(loaded)
    where = {r: {b: vars(t) for b, t in by.items()} for r, by in refs.items()}
    record = {"checkpoint": state.sha256, **summary, "row_tables": where}
    ref = put_json(io.store, record, "evaluation_rows.json")
    tracker = _tracker(config_yaml, spec, mlflow_run)
    if tracker is not None:
        metrics = row_metrics(summary)
        tracker.log_step(0, {k: v for m in metrics.values() for k, v in m.items()})
        text = f"{scores_markdown(summary)}\n\n{costs_markdown(summary)}\n"
        tracker.client.log_text(tracker.run_id, text, "evaluation_rows.md")
        tracker.client.log_text(
            tracker.run_id, io.store.get_bytes(ref).decode(), "evaluation_rows.json"
        )
        tracker.set_tags({"sha256.evaluation": ref.sha256, "sha256.checkpoint": state.sha256})
        if "checkpoint" in metrics:
            own = metrics["checkpoint"]
            tag_registered_adapters(cfg, registered_model_name(cfg), state.sha256, own)
    return ref
