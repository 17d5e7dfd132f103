"""The world a run acts in: role catalogue, executor, evaluator and its task records."""

from __future__ import annotations

from dataclasses import dataclass

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.config import RunConfig
from evosteer_core.executors.base import Executor
from evosteer_core.records import TaskRecord
from evosteer_core.roles import Catalogue, default_catalogue
from evosteer_core.runtime import Evaluator


@dataclass
class World:
    """Everything outside the learner: who executes nodes, how answers are scored, on what."""

    catalogue: Catalogue
    executor: Executor
    evaluator: Evaluator
    train_records: list[TaskRecord]
    heldout_records: list[TaskRecord]


def build_executor(cfg: RunConfig) -> Executor:
    """The configured executor backend (``sim`` is labelled simulated wherever shown)."""
    ex = cfg.executor
    if ex.kind == "sim":
        from evosteer_core.sim.executor import SimExecutor

        return SimExecutor()
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


def build_world(cfg: RunConfig) -> World:
    """Sim suite records for the sim executor; the sim's split seeds keep train/held-out apart."""
    from evosteer_core.sim.suite import make_sim_suite

    sim = cfg.sim
    return World(
        catalogue=default_catalogue(),
        executor=build_executor(cfg),
        evaluator=evaluate,
        train_records=make_sim_suite(sim.n_train_per_family, sim.seed, "train"),
        heldout_records=make_sim_suite(sim.n_heldout_per_family, sim.seed, "heldout"),
    )
