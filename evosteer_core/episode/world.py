"""The world a run acts in: role catalogue, executor, evaluator and its task records."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from evosteer_core.benchmarks.loaders import CONVERTERS, DEFAULT_FILES, GENERATED, load_benchmark
from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.benchmarks.schema import records_from_table_bytes, task_table_bytes
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import Catalogue, default_catalogue
from evosteer_core.episode.runtime import Evaluator
from evosteer_core.executors.base import Executor
from evosteer_core.executors.serve import shared_server
from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore, open_store
from evosteer_core.infra.config import BenchmarkSlice, RetrieverConfig, RunConfig, StoreConfig
from evosteer_core.infra.configio import ConfigError
from evosteer_core.infra.locks import run_log_path
from evosteer_core.infra.runs import run_id_for
from evosteer_core.tools import sandbox

if TYPE_CHECKING:
    from evosteer_core.executors.openai import EnvironmentFactory
    from evosteer_core.tools.search import Retriever


@dataclass
class World:
    """Everything outside the learner: who executes nodes, how answers are scored, on what.

    ``evaluator`` is the official reward (evaluation, held-out scores); ``train_evaluator``
    is the training reward, which adds the options of the config's ``reward`` section.
    """

    catalogue: Catalogue
    executor: Executor
    evaluator: Evaluator
    train_evaluator: Evaluator
    train_records: list[TaskRecord]
    heldout_records: list[TaskRecord]


def build_retriever(rc: RetrieverConfig, store: StoreConfig) -> Retriever:
    """The search tool's retriever: BM25 over the corpus file or store object (indexed now,
    so a bad corpus fails here), or the HTTP service."""
    from evosteer_core.tools.search import BM25Retriever, HTTPRetriever

    if rc.kind == "http":
        assert rc.url is not None  # RetrieverConfig checked it
        return HTTPRetriever(rc.url, timeout_s=rc.timeout_s)
    if rc.corpus is not None:
        key, path = "executor.retriever.corpus", Path(rc.corpus)
        try:
            return BM25Retriever.from_jsonl(path, rc.id_field, rc.text_field)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{key}: cannot index {path} as a JSONL corpus: {exc}") from exc
    assert rc.corpus_ref is not None  # RetrieverConfig checked it
    key = "executor.retriever.corpus_ref"
    with tempfile.TemporaryDirectory(prefix="evosteer-corpus-") as tmp:
        path = Path(tmp) / "corpus.jsonl"
        try:
            open_store(store.root, store.s3_endpoint).get_file(rc.corpus_ref, path)
            return BM25Retriever.from_jsonl(path, rc.id_field, rc.text_field)
        except (LookupError, OSError, ValueError, RuntimeError) as exc:
            raise ValueError(
                f"{key}: cannot index {rc.corpus_ref.uri} (sha256 {rc.corpus_ref.sha256[:12]}…) "
                f"from store {store.root} as a JSONL corpus: {exc}"
            ) from exc


def build_environment_factory(name: str | None) -> EnvironmentFactory | None:
    """The interactive family's environment factory named by ``executor.environment``."""
    if name is None:
        return None
    from evosteer_core.executors.textworld_env import TextWorldFactory

    return TextWorldFactory()


def serve_log_path(cfg: RunConfig) -> Path:
    """Where the run's managed model server writes its output: beside the run's log."""
    return run_log_path(cfg.store.root, run_id_for(cfg), ".serve.log")


def build_executor(cfg: RunConfig) -> Executor:
    """The configured executor backend (``sim`` is labelled simulated wherever shown)."""
    ex = cfg.executor
    if ex.kind == "sim":
        from evosteer_core.sim.executor import SimExecutor
        from evosteer_core.sim.model import DEFAULT_MODEL

        return SimExecutor(DEFAULT_MODEL.with_orchestration_effect(cfg.sim.orchestration_effect))
    from evosteer_core.executors.openai import OpenAIExecutor

    base_url, model = ex.base_url, ex.model
    if ex.serve is not None:
        server = shared_server(ex.serve, serve_log_path(cfg), ex.temperature)
        base_url, model = server.base_url, server.model_id
    if not base_url or not model:
        raise ValueError("executor.kind 'openai' needs executor.base_url and executor.model")
    api_key = None
    if ex.api_key_env is not None:
        api_key = os.environ.get(ex.api_key_env)
        if not api_key:
            raise ValueError(
                f"executor.api_key_env: the environment variable {ex.api_key_env!r} is not set"
            )
    return OpenAIExecutor(
        base_url=base_url,
        model=model,
        api_key=api_key,
        timeout_s=ex.timeout_s,
        max_retries=ex.retries,
        backoff_s=ex.backoff_s,
        temperature=ex.temperature,
        retriever=None if ex.retriever is None else build_retriever(ex.retriever, cfg.store),
        environment_factory=build_environment_factory(ex.environment),
    )


def check_executor_support(
    cfg: RunConfig, catalogue: Catalogue, executor: Executor, records: list[TaskRecord]
) -> None:
    """Fail before any rollout when a record's family needs what the ``openai`` executor was
    not given: the search tool (a family where an offered role may search) needs
    ``executor.retriever``, an interactive family needs an ``executor.environment`` that can
    run each of its records. The simulator brings both."""
    if cfg.executor.kind != "openai":
        return
    seen: set[str] = set()
    for record in records:
        family = record.family
        if family not in seen:
            seen.add(family)
            roles = catalogue.roles_for(family)
            searches = any("search" in catalogue.tools_for(r.role_id, family) for r in roles)
            if searches and cfg.executor.retriever is None:
                raise ValueError(
                    f"executor.retriever: family {family!r} (record {record.record_id!r}) uses "
                    "the search tool and no retriever is configured; set executor.retriever "
                    "({kind: bm25, corpus: FILE.jsonl} or corpus_ref, or {kind: http, url: URL})"
                )
        if not catalogue.family(family).interactive:
            continue
        factory = getattr(executor, "environment_factory", None)
        harness = record.meta.get("harness", record.source)
        if factory is None:
            raise ValueError(
                f"executor.environment: record {record.record_id!r} is interactive "
                f"({harness}) and no environment is configured; set executor.environment "
                "(available: textworld)"
            )
        try:
            factory.check(record)
        except ValueError as exc:
            raise ValueError(
                f"executor.environment: {cfg.executor.environment!r} cannot run record "
                f"{record.record_id!r}: {exc}"
            ) from None


def stage_benchmark(store: ArtifactStore, name: str, path: str | None) -> ArtifactRef:
    """Load benchmark ``name`` from ``path`` (or its built-in data) once, validate every row
    (``load_benchmark``: the pandera task-table schema) and store it as a content-addressed
    task table (``schema.task_table_bytes``)."""
    return store.put_bytes(task_table_bytes(load_benchmark(name, path)), f"{name}.tasks.jsonl")


def stage_records(store: ArtifactStore, records: list[TaskRecord], name: str) -> ArtifactRef:
    """Store already loaded records as a validated task table."""
    return store.put_bytes(task_table_bytes(records), f"{name}.tasks.jsonl")


def stored_records(store: ArtifactStore, ref: ArtifactRef) -> list[TaskRecord]:
    """The records of a stored task table (hash-checked by the store, schema-checked here)."""
    return records_from_table_bytes(store.get_bytes(ref))


def stage_data(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every benchmark slice given as a ``ref`` into the run's store: each file
    is read and validated once, where the run is launched (a pod sees only the store: a file
    that is not there fails here, as any bad file does), and a file two slices share is
    stored once. Slices that already have a ref are kept; a sim
    config comes back unchanged."""
    if cfg.data.source == "sim":
        return cfg
    store = open_store(cfg.store.root, cfg.store.s3_endpoint)
    staged: dict[tuple[str, str | None], ArtifactRef] = {}

    def stage(sl: BenchmarkSlice, where: str) -> BenchmarkSlice:
        if sl.ref is not None:
            return sl
        _check_slice(sl, where)
        key = (sl.name, sl.path)
        if key not in staged:
            staged[key] = stage_benchmark(store, sl.name, sl.path)
        return replace(sl, ref=staged[key])

    data = replace(
        cfg.data,
        train=tuple(stage(sl, f"data.train[{i}]") for i, sl in enumerate(cfg.data.train)),
        heldout=tuple(stage(sl, f"data.heldout[{i}]") for i, sl in enumerate(cfg.data.heldout)),
    )
    return replace(cfg, data=data)


def staged_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` ready for a launch that sees no local file: every benchmark slice staged
    (:func:`stage_data`), every row checked (:func:`load_records`) and each slice's file path
    dropped, so the slices name only their tables in the store. The run id is the one a
    ``train`` of ``cfg`` gets (a staged slice is hashed by its table, not its path)."""
    staged = stage_data(cfg)
    load_records(staged)

    def ref_only(slices: tuple[BenchmarkSlice, ...]) -> tuple[BenchmarkSlice, ...]:
        return tuple(replace(sl, path=None) for sl in slices)

    data = replace(
        staged.data, train=ref_only(staged.data.train), heldout=ref_only(staged.data.heldout)
    )
    return replace(staged, data=data)


def _check_slice(sl: BenchmarkSlice, where: str) -> None:
    if sl.name not in CONVERTERS:
        known = ", ".join(sorted(CONVERTERS))
        raise ConfigError("<config>", f"{where}.name", f"unknown benchmark {sl.name!r} ({known})")
    shipped = sl.name in DEFAULT_FILES or sl.name in GENERATED
    if sl.ref is None and sl.path is None and not shipped:  # a staged slice needs no file
        raise ConfigError("<config>", f"{where}.path", f"benchmark {sl.name!r} needs a file")


def load_slices(
    slices: tuple[BenchmarkSlice, ...], key: str, store: StoreConfig
) -> list[TaskRecord]:
    """The records of each benchmark slice of config list ``key``, in order.

    A slice with a ``ref`` is read from the store's task table; one without is read from its
    file. Either way every row is checked (a bad file row fails with ``file:line: field``),
    and a slice must be loadable and select at least one row (else a ConfigError naming the
    slice's key).
    """
    records: list[TaskRecord] = []
    opened: ArtifactStore | None = None
    for i, sl in enumerate(slices):
        where = f"{key}[{i}]"
        _check_slice(sl, where)
        if sl.ref is None:
            rows = load_benchmark(sl.name, sl.path)
        else:
            opened = opened or open_store(store.root, store.s3_endpoint)
            rows = stored_records(opened, sl.ref)
        if sl.offset >= len(rows):
            raise ConfigError(
                "<config>",
                f"{where}.offset",
                f"{sl.offset} selects no rows: {sl.path or sl.name} holds {len(rows)}",
            )
        end = None if sl.limit is None else sl.offset + sl.limit
        records += rows[sl.offset : end]
    return records


def load_split(cfg: RunConfig, split: str) -> list[TaskRecord]:
    """The records of one split (``train`` or ``heldout``): the synthetic suite's (its split
    seeds keep them apart) or those of every ``data.<split>`` benchmark slice."""
    if cfg.data.source == "sim":
        from evosteer_core.sim.suite import make_sim_suite

        sim = cfg.sim
        n = sim.n_train_per_family if split == "train" else sim.n_heldout_per_family
        return make_sim_suite(n, sim.seed, split)
    return load_slices(getattr(cfg.data, split), f"data.{split}", cfg.store)


def load_records(cfg: RunConfig) -> tuple[list[TaskRecord], list[TaskRecord]]:
    """(train, held-out) records (:func:`load_split`), read and validated in full. The train
    workflow calls it before the first step, so bad data fails there, not in a rollout task."""
    train, heldout = load_split(cfg, "train"), load_split(cfg, "heldout")
    if cfg.data.source == "sim":
        return train, heldout
    overlap = {r.record_id for r in train} & {r.record_id for r in heldout}
    if overlap:
        raise ConfigError(
            "<config>", "data", f"train and heldout slices overlap in {sorted(overlap)[:3]}"
        )
    return train, heldout


def build_world(cfg: RunConfig) -> World:
    """The records of :func:`load_records`, the configured executor and the reward of
    ``benchmarks.rewards``. Applies the sandbox policy (``executor.sandbox``) process-wide."""
    train, heldout = load_records(cfg)
    return world_for(cfg, train, heldout)


def world_for(cfg: RunConfig, train: list[TaskRecord], heldout: list[TaskRecord]) -> World:
    """The world of :func:`build_world` on the given records (the offline workflow search
    builds one on the training records alone, ``paradigms.searched``, and so does the warm
    start, ``training.warm_start``, which never loads the held-out split: ``load_split``)."""
    box = cfg.executor.sandbox
    sandbox.configure(allow_weak_sandbox=box.allow_weak_sandbox, packages=box.packages)
    catalogue, executor = default_catalogue(), build_executor(cfg)
    check_executor_support(cfg, catalogue, executor, train + heldout)
    return World(
        catalogue=catalogue,
        executor=executor,
        evaluator=evaluate,
        train_evaluator=partial(evaluate, yes_no_first_token=cfg.reward.yes_no_first_token),
        train_records=train,
        heldout_records=heldout,
    )
