"""A circuit breaker around an executor, and the executor-outage error of a rollout.

Within one rollout, node executions run one after another. When
``max_consecutive_failures`` of them in a row end in ``infra_failure`` (each one already
after the executor's own retries), the executor is taken to be down: the breaker opens and
every later node execution of the rollout returns ``infra_failure`` (``circuit_open``)
without calling the executor, so a dead or hanging server costs at most that many calls
(docs/reliability.md, "Executor outages").
"""

from __future__ import annotations

from evosteer_core.episode.records import TaskRecord
from evosteer_core.executors.base import Environment, Executor, NodeRequest, NodeResult

DEFAULT_MAX_CONSECUTIVE_FAILURES = 5
"""Consecutive infrastructure failures that open the breaker (``executor.max_consecutive_failures``)."""

DEFAULT_MIN_HEALTHY_FRACTION = 0.5
"""The least healthy fraction of a rollout's trajectories (``executor.min_healthy_fraction``)."""


class ExecutorOutageError(RuntimeError):
    """Too few of a rollout's trajectories ran without an infrastructure failure.

    Recoverable: the Flyte task layer re-raises it as ``FlyteRecoverableException``, so the
    task is retried and the failed rollout is never cached as a result."""


class CircuitBreaker:
    """Runs nodes on ``executor`` until ``threshold`` consecutive infrastructure failures."""

    def __init__(self, executor: Executor, threshold: int) -> None:
        if threshold < 1:
            raise ValueError(f"circuit breaker: threshold must be >= 1, got {threshold}")
        self.executor = executor
        self.name = executor.name
        self.threshold = threshold
        self.consecutive = 0
        self.calls = 0
        """Node executions passed on to the executor."""
        self.refused = 0
        """Node executions answered ``circuit_open`` without calling the executor."""

    @property
    def open(self) -> bool:
        return self.consecutive >= self.threshold

    def run_node(self, request: NodeRequest) -> NodeResult:
        if self.open:
            self.refused += 1
            return NodeResult("", None, status="infra_failure", failure_kind="circuit_open")
        self.calls += 1
        result = self.executor.run_node(request)
        self.consecutive = self.consecutive + 1 if result.status == "infra_failure" else 0
        return result

    def make_environment(self, task: TaskRecord, seed_key: tuple[int, str]) -> Environment | None:
        return self.executor.make_environment(task, seed_key)
