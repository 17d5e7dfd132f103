"""A circuit breaker around an executor, and the executor-outage error of a rollout.

When ``max_consecutive_failures`` node executions of a rollout in a row end in
``infra_failure`` (each one already after the executor's own retries), the executor is taken
to be down: the breaker opens and every later node execution of the rollout returns
``infra_failure`` (``circuit_open``) without calling the executor, so a dead or hanging
server costs at most that many calls (docs/reliability.md, "Executor outages").

Executions run one after another, or a round of them at once (``executor.concurrency``):
inside a :meth:`CircuitBreaker.round` the breaker stays as it was when the round began and the
round's outcomes are counted afterwards in the order of its lanes (episodes), so which calls
it refuses never depends on which reply came back first.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

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

        self._lock = threading.Lock()
        self._held: list[tuple[int, bool]] | None = None
        """Inside a round: (lane, failed) of each execution, counted when the round ends."""

    @property
    def open(self) -> bool:
        return self.consecutive >= self.threshold

    def run_node(self, request: NodeRequest, lane: int = 0) -> NodeResult:
        with self._lock:
            if self.open:
                self.refused += 1
                return NodeResult("", None, status="infra_failure", failure_kind="circuit_open")
            self.calls += 1
        result = self.executor.run_node(request)
        failed = result.status == "infra_failure"
        with self._lock:
            if self._held is None:
                self._count(failed)
            else:
                self._held.append((lane, failed))
        return result

    def _count(self, failed: bool) -> None:
        self.consecutive = self.consecutive + 1 if failed else 0

    @contextmanager
    def round(self) -> Iterator[None]:
        """Executions started inside see the breaker as it was when the round began; their
        outcomes are counted when it ends, in lane order (deterministic under concurrency)."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            for _, failed in sorted(held, key=lambda h: h[0]):
                self._count(failed)

    def lane(self, index: int) -> Lane:
        """The executor one episode sees: this breaker, its outcomes ordered as lane ``index``."""
        return Lane(self, index)

    def make_environment(self, task: TaskRecord, seed_key: tuple[int, str]) -> Environment | None:
        return self.executor.make_environment(task, seed_key)


class Lane:
    """One episode's view of a shared :class:`CircuitBreaker` (an :class:`Executor`)."""

    def __init__(self, breaker: CircuitBreaker, index: int) -> None:
        self.breaker = breaker
        self.index = index
        self.name = breaker.name

    def run_node(self, request: NodeRequest) -> NodeResult:
        return self.breaker.run_node(request, self.index)

    def make_environment(self, task: TaskRecord, seed_key: tuple[int, str]) -> Environment | None:
        return self.breaker.make_environment(task, seed_key)
