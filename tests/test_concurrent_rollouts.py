"""Node executions of different episodes at once (``executor.concurrency``, issue 15).

A local chat server answers every request from its own seed after a delay drawn from that
seed, so replies come back in another order than they were sent. A rollout with 4 workers must
then give the same tables as the serial rollout, and the server must really have had several
requests in flight. The measured clocks (decision time, node latency) are the only inputs that
differ between two runs of a real executor; the test makes them functions of the tokens, as the
simulator's clock is, so that what is compared is the effect of the completion order alone.
The circuit breaker's round counts outcomes in episode order, whatever order they came in.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
from json_server import JSONServer

from evosteer_core.episode.rollout import EpisodePlan, collect_rollouts, run_concurrently
from evosteer_core.executors.base import NodeRequest, NodeResult
from evosteer_core.executors.breaker import CircuitBreaker
from evosteer_core.infra.config import load_config
from evosteer_core.training.session import init_state, open_session

DATA = Path(__file__).parent / "data" / "benchmarks"


class SeededChat:
    """A chat-completions responder: the reply and its delay follow from the request's seed;
    it records the most requests it had in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0
        self.requests = 0
        self._lock = threading.Lock()

    def __call__(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, object]:
        seed = int(body["seed"])
        with self._lock:
            self.in_flight += 1
            self.requests += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep((seed % 7) * 0.015)
        with self._lock:
            self.in_flight -= 1
        text = f"Working it out. The answer is \\boxed{{{seed % 3}}}."
        reply = {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": {"prompt_tokens": 40 + seed % 11, "completion_tokens": 12 + seed % 5},
        }
        return 200, reply


class TokenClock:
    """The executor with its measured latency replaced by a function of the tokens."""

    def __init__(self, executor) -> None:
        self.executor = executor
        self.name = executor.name

    def run_node(self, request: NodeRequest) -> NodeResult:
        result = self.executor.run_node(request)
        return dataclasses.replace(result, latency_s=0.001 * (result.tokens_in + result.tokens_out))

    def make_environment(self, task, seed_key):
        return self.executor.make_environment(task, seed_key)


def _rollout(tmp_path: Path, url: str, concurrency: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    cfg = load_config(
        None,
        overrides={
            "store.root": str(tmp_path / f"store{concurrency}"),
            "executor.kind": "openai",
            "executor.base_url": url,
            "executor.model": "m",
            "executor.concurrency": concurrency,
            "data.source": "benchmarks",
            "data.train": [{"name": "aime", "path": str(DATA / "aime.jsonl")}],
            "budget.max_actions": 4,
        },
    )
    s = open_session(cfg, init_state(cfg))
    ctx = s.rollout_context(cfg.train.seed, 1, {}, evaluation=False)
    assert ctx.concurrency == concurrency
    ctx = dataclasses.replace(
        ctx,
        executor=TokenClock(ctx.executor),
        decision_clock=lambda prompt, action: 0.0001 * (prompt + action),
    )
    plans = [
        EpisodePlan(rec, arm, k)
        for rec in s.world.train_records[:3]
        for arm in ("theta", "rho")
        for k in range(2)
    ]
    return collect_rollouts(s.policy, plans, ctx)


def test_concurrent_rollouts_equal_serial_ones_whatever_the_completion_order(tmp_path):
    chat = SeededChat()
    with JSONServer(chat) as server:
        url = f"{server.root}/v1"
        serial = _rollout(tmp_path, url, 1)
        assert chat.most_in_flight == 1
        sent = chat.requests
        concurrent = _rollout(tmp_path, url, 4)
    assert chat.most_in_flight >= 2, "no two node executions were in flight at once"
    assert chat.requests - sent == sent
    for a, b in zip(serial, concurrent, strict=True):
        pd.testing.assert_frame_equal(a, b)
    trajectories = serial[0]
    assert trajectories["model_calls"].sum() > len(trajectories)  # node calls, not only decisions
    assert trajectories["healthy"].all()


class Scripted:
    """An executor whose outcome per node id is given; ``order`` records the calls."""

    name = "scripted"

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing

    def run_node(self, request: NodeRequest) -> NodeResult:
        if request.node_id in self.failing:
            return NodeResult("", None, status="infra_failure", failure_kind="unreachable")
        return NodeResult("ok", None)

    def make_environment(self, task, seed_key):
        return None


def _request(node_id: str) -> NodeRequest:
    return NodeRequest(
        task=None,
        node_id=node_id,
        role=None,
        tools=(),
        skills=(),
        messages=(),  # type: ignore[arg-type]
        previous_output=None,
        prompt="",
        limits=None,
        seed_key=(0, "", node_id, 0),  # type: ignore[arg-type]
    )


def test_a_round_counts_failures_in_lane_order_and_stays_closed_within_it():
    breaker = CircuitBreaker(Scripted({"f"}), threshold=2)
    with breaker.round():
        # completion order: lane 2 fails, lane 0 fails, lane 1 succeeds, lane 3 fails
        for lane, node in ((2, "f"), (0, "f"), (1, "ok"), (3, "f")):
            assert breaker.lane(lane).run_node(_request(node)).status != "ok" or node == "ok"
        assert not breaker.open  # nothing counted inside the round
    # lane order: fail, ok, fail, fail -> two in a row at the end
    assert breaker.consecutive == 2 and breaker.open
    refused = breaker.lane(0).run_node(_request("ok"))
    assert refused.failure_kind == "circuit_open" and breaker.refused == 1


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_the_count_after_a_round_does_not_depend_on_the_completion_order(order):
    outcomes = {0: "f", 1: "f", 2: "ok"}
    breaker = CircuitBreaker(Scripted({"f"}), threshold=5)
    breaker.consecutive = 1
    with breaker.round():
        for lane in order:
            breaker.lane(lane).run_node(_request(outcomes[lane]))
    assert breaker.consecutive == 0  # lane 2 (ok) comes last in lane order


def test_outside_a_round_outcomes_count_as_they_come():
    breaker = CircuitBreaker(Scripted({"f"}), threshold=2)
    breaker.run_node(_request("f"))
    assert breaker.consecutive == 1
    breaker.run_node(_request("f"))
    assert breaker.open


def test_run_concurrently_keeps_call_order_and_raises_the_first_error():
    def slow(k: int) -> int:
        time.sleep(0.02 * (5 - k))
        return k * k

    assert run_concurrently([partial(slow, k) for k in range(5)], 3) == [0, 1, 4, 9, 16]

    def fail(k: int) -> None:
        time.sleep(0.05 if k == 1 else 0.0)
        raise ValueError(f"call {k}")

    with pytest.raises(ValueError, match="call 1"):
        run_concurrently([partial(slow, 0), partial(fail, 1), partial(fail, 2)], 3)


def test_a_stopped_run_does_not_wait_for_the_calls_in_flight():
    """SIGTERM while node calls hang: the process exits at once (a thread pool would join
    its workers first, for as long as the calls take)."""
    code = textwrap.dedent(
        """
        import signal, sys, time
        from evosteer_core.episode.rollout import run_concurrently
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
        print("ready", flush=True)
        run_concurrently([lambda: time.sleep(60)] * 2, 2)
        """
    )
    root = Path(__file__).parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 3
    assert time.monotonic() - started < 10
