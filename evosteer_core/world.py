"""The world a run acts in: role catalogue, executor, evaluator and its task records."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from evosteer_core.benchmarks.loaders import load_benchmark
from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.config import BenchmarkSlice, RunConfig
from evosteer_core.executors.base import Executor
from evosteer_core.records import TaskRecord
from evosteer_core.roles import Catalogue, default_catalogue
from evosteer_core.runtime import Evaluator


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


def build_executor(cfg: RunConfig) -> Executor:
    """The configured executor backend (``sim`` is labelled simulated wherever shown)."""
    ex = cfg.executor
    if ex.kind == "sim":
        from evosteer_core.sim.executor import SimExecutor
        from evosteer_core.sim.model import DEFAULT_MODEL

        return SimExecutor(DEFAULT_MODEL.with_orchestration_effect(cfg.sim.orchestration_effect))
    from evosteer_core.executors.openai import OpenAIExecutor

    if not ex.base_url or not ex.model:
        raise ValueError("executor.kind 'openai' needs executor.base_url and executor.model")
    return OpenAIExecutor(
        base_url=ex.base_url,
        model=ex.model,
        timeout_s=ex.timeout_s,
        max_retries=ex.retries,
        backoff_s=ex.backoff_s,
        temperature=ex.temperature,
    )


def load_slices(slices: tuple[BenchmarkSlice, ...]) -> list[TaskRecord]:
    """The records of each benchmark slice, in order (errors name file, line and field)."""
    records: list[TaskRecord] = []
    for sl in slices:
        rows = load_benchmark(sl.name, sl.path)
        end = None if sl.limit is None else sl.offset + sl.limit
        records += rows[sl.offset : end]
    return records


def build_world(cfg: RunConfig) -> World:
    """Records from the synthetic suite (its split seeds keep train/held-out apart) or from
    benchmark slices (``data.source: benchmarks``); the configured executor and the reward of
    ``benchmarks.rewards``."""
    if cfg.data.source == "sim":
        from evosteer_core.sim.suite import make_sim_suite

        sim = cfg.sim
        train = make_sim_suite(sim.n_train_per_family, sim.seed, "train")
        heldout = make_sim_suite(sim.n_heldout_per_family, sim.seed, "heldout")
    else:
        train, heldout = load_slices(cfg.data.train), load_slices(cfg.data.heldout)
        overlap = {r.record_id for r in train} & {r.record_id for r in heldout}
        if overlap:
            raise ValueError(f"data: train and heldout slices overlap in {sorted(overlap)[:3]}")
    return World(
        catalogue=default_catalogue(),
        executor=build_executor(cfg),
        evaluator=evaluate,
        train_evaluator=partial(evaluate, yes_no_first_token=cfg.reward.yes_no_first_token),
        train_records=train,
        heldout_records=heldout,
    )
