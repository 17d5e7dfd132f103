"""Executor outages (docs/reliability.md, "Executor outages"): an episode stops at its first
infrastructure failure, a circuit breaker stops a rollout when the executor is down or hangs,
a rollout below ``executor.min_healthy_fraction`` is a recoverable executor outage that is
never cached, and a partial outage is logged (MLflow, progress line) and warned about."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from fault_server import FaultServer
from flytekit.exceptions.user import FlyteRecoverableException
from json_server import JSONServer
from mlflow import MlflowClient
from pipeline_support import isolate_flyte_cache

from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.rollout import (
    EpisodePlan,
    RolloutContext,
    collect_rollouts,
    rollout_health,
)
from evosteer_core.executors.base import NodeResult
from evosteer_core.executors.breaker import CircuitBreaker, ExecutorOutageError
from evosteer_core.executors.openai import OpenAIExecutor
from evosteer_core.infra.config import ConfigError, load_config
from evosteer_core.infra.tracking import resolve_tracking
from evosteer_core.policy.orchestrator import Choice
from evosteer_core.sim.suite import make_sim_record
from evosteer_core.training.heads import ValueHead
from evosteer_flyte.cli import main as cli_main

CAT = default_catalogue()
RECORDS = [make_sim_record("aime", i, 0, "train") for i in range(12)]
DATA = Path(__file__).parent / "data" / "benchmarks"
OK_REPLY = {
    "choices": [{"message": {"content": "The answer is 42."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5},
}


class NodeRunner:
    """A policy that always picks a node-executing action when one is legal (so a rollout
    keeps calling the executor for as long as its episodes let it)."""

    max_action_tokens = 8

    def count_tokens(self, prompt: str) -> int:
        return 10

    def sample(
        self,
        prompts: Sequence[str],
        legal: Sequence[Sequence[str]],
        generators: Sequence[torch.Generator],
        use_adapter: bool,
        temperature: float = 1.0,
        encode: bool = False,
    ) -> list[Choice]:
        def pick(acts: Sequence[str]) -> int:
            calls = [i for i, a in enumerate(acts) if "ADD_AGENT" in a or "RERUN_AGENT" in a]
            return calls[0] if calls else 0

        h = [1.0] * 4 if encode else None
        return [Choice(pick(acts), -0.5, 10, 5, h) for acts in legal]


def context(executor: OpenAIExecutor, max_actions: int = 32, **kw: object) -> RolloutContext:
    return RolloutContext(
        catalogue=CAT,
        limits=BudgetLimits(max_actions=max_actions),
        executor=executor,
        evaluator=lambda task, text, env: 0.0,
        menus={},
        value_head=ValueHead(seed=0),
        run_seed=3,
        step=1,
        **kw,
    )


def plans(n: int) -> list[EpisodePlan]:
    return [EpisodePlan(r, "theta", 0) for r in RECORDS[:n]]


def executor(srv: FaultServer, **kw: object) -> OpenAIExecutor:
    return OpenAIExecutor(srv.base_url, "m", **{"max_retries": 0, "backoff_s": 0.0, **kw})


def test_an_episode_stops_at_its_first_infrastructure_failure():
    with FaultServer(["ok", "http_500", "ok"]) as srv:
        ctx = context(executor(srv), max_consecutive_failures=10, min_healthy_fraction=0.0)
        traj, dec = collect_rollouts(NodeRunner(), plans(1), ctx)
    # one good node execution, one failed one, then no further call (before: one per action
    # until max_actions, 32)
    assert len(srv.log) == 2
    row = traj.iloc[0]
    assert not row["healthy"] and row["complete"]
    assert row["model_calls"] == 1
    after = dec[dec["t"] >= 2]
    assert after["forced"].all() and len(after) <= 2  # SET_OUTPUT / STOP only


def test_the_breaker_stops_a_rollout_on_a_dead_executor_and_raises_an_outage():
    with FaultServer("http_500") as srv:
        ctx = context(executor(srv, max_retries=1), max_consecutive_failures=3)
        with pytest.raises(ExecutorOutageError) as info:
            collect_rollouts(NodeRunner(), plans(12), ctx)
    assert len(srv.log) == 3 * 2  # threshold x (retries + 1); before: 12 x 32 x 2
    message = str(info.value)
    assert message.startswith(
        "executor outage at step 1: healthy fraction 0.000 is below "
        "executor.min_healthy_fraction 0.5: 12 of 12 trajectories hit an infrastructure "
        "failure of executor openai (circuit_open x9, http_500 x3); the circuit breaker "
        "opened after 3 consecutive failures"
    )
    assert "\n" not in message


def test_an_evaluation_on_a_dead_executor_is_an_outage_too():
    with FaultServer("http_500") as srv:
        ctx = context(executor(srv), max_consecutive_failures=2)
        evaluation = [EpisodePlan(r, "theta", 0, evaluation=True) for r in RECORDS[:4]]
        with pytest.raises(ExecutorOutageError, match="^executor outage in an evaluation rollout"):
            collect_rollouts(NodeRunner(), evaluation, ctx)
    assert len(srv.log) == 2


def test_a_hanging_executor_costs_at_most_the_breaker_threshold_times_a_call():
    timeout_s, retries, threshold = 0.25, 1, 2
    bound = threshold * (retries + 1) * timeout_s  # backoff_s = 0
    with FaultServer("hang", deadline_s=20) as srv:
        ex = executor(srv, timeout_s=timeout_s, max_retries=retries)
        ctx = context(ex, max_consecutive_failures=threshold)
        start = time.monotonic()
        with pytest.raises(ExecutorOutageError, match="timeout x2"):
            collect_rollouts(NodeRunner(), plans(12), ctx)
        elapsed = time.monotonic() - start
    assert len(srv.log) == threshold * (retries + 1)
    # before: every episode kept calling, 12 x 32 x 0.5 s (cut short only by the server's
    # own 20 s deadline)
    assert bound <= elapsed < bound + 3.0


def test_a_partial_outage_warns_and_keeps_the_healthy_trajectories(caplog):
    with FaultServer(["ok", "ok", "ok", "http_500"] * 40) as srv:
        # two node executions per episode, every fourth call fails
        ctx = context(executor(srv), max_actions=3, min_healthy_fraction=0.0)
        with caplog.at_level(logging.WARNING, logger="evosteer_core.episode.rollout"):
            traj, _ = collect_rollouts(NodeRunner(), plans(8), ctx)
    health = rollout_health(traj)
    assert health["infra_failures"] == (~traj["healthy"]).sum() > 0
    assert 0 < health["healthy_fraction"] < 1
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    n = health["infra_failures"]
    assert warning.getMessage().startswith(
        f"executor failures at step 1: healthy fraction {health['healthy_fraction']:.3f}: "
        f"{n} of 8 trajectories hit an infrastructure failure of executor openai (http_500 x{n})"
    )


def test_the_breaker_passes_calls_until_the_threshold_and_resets_on_success():
    script = ["infra_failure", "infra_failure", "ok", *["infra_failure"] * 3]
    results = iter(script)

    class Scripted:
        name = "scripted"

        def run_node(self, request):
            return NodeResult("", None, status=next(results))

        def make_environment(self, task, seed_key):
            return None

    breaker = CircuitBreaker(Scripted(), threshold=3)
    assert [breaker.run_node(None).status for _ in script] == script
    assert breaker.open and breaker.calls == 6 and breaker.refused == 0
    refused = breaker.run_node(None)  # the script is exhausted: no call is made
    assert (refused.status, refused.failure_kind) == ("infra_failure", "circuit_open")
    assert breaker.refused == 1


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_consecutive_failures", 0, "max_consecutive_failures: must be >= 1, got 0"),
        ("min_healthy_fraction", 1.5, r"min_healthy_fraction: must be in \[0, 1\], got 1.5"),
    ],
)
def test_breaker_settings_are_checked(key, value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, {f"executor.{key}": value})


# --- a real local Flyte execution through the CLI ----------------------------------------
def _train_args(root: Path, base_url: str) -> list[str]:
    sets = {
        "executor.kind": "openai",
        "executor.base_url": base_url,
        "executor.model": "m",
        "executor.retries": 0,
        "executor.backoff_s": 0,
        "executor.min_healthy_fraction": 0.25,
        "data.source": "benchmarks",
        "data.train": f'[{{"name": "aime", "path": "{DATA / "aime.jsonl"}"}}]',
        "data.heldout": f'[{{"name": "math_hard", "path": "{DATA / "math_hard.jsonl"}"}}]',
        "train.batch_size": 3,
        "train.value_fit_steps": 5,
    }
    args = ["train", "--steps", "1", "--run-dir", str(root)]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return args


def test_an_outage_fails_in_one_line_and_is_not_cached(tmp_path, monkeypatch, capsys, caplog):
    """Executor down: the train fails naming the outage, a recoverable Flyte error. Server
    back (every 6th call still failing): the same command calls the executor again, trains,
    and logs the rollout's health to MLflow and the progress line (before: zero requests,
    the same failure)."""
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    down = {"on": True}
    requests: list[int] = []

    def respond(path: str, body: dict, headers: dict) -> tuple[int, object]:
        requests.append(1)
        if down["on"] or len(requests) % 6 == 0:
            return 500, {"error": "injected"}
        return 200, OK_REPLY

    with JSONServer(respond) as srv:
        args = _train_args(tmp_path / "run", f"{srv.root}/v1")
        assert cli_main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("evosteer train: executor outage at step 1: healthy fraction 0.000")
        assert "the circuit breaker opened after 5 consecutive failures" in err
        assert len(requests) == 5
        # the rollout task raised it as Flyte's recoverable error (retried on a cluster)
        with pytest.raises(FlyteRecoverableException) as info:
            cli_main(["--debug", *args])
        assert isinstance(info.value.__cause__, ExecutorOutageError)
        assert len(requests) == 10  # the failed rollout was not cached

        down["on"] = False
        requests.clear()
        assert cli_main(args) == 0
        out, err = capsys.readouterr()
    assert len(requests) > 5
    cfg = load_config(None, {"store.root": str(tmp_path / "run")})
    client = MlflowClient(tracking_uri=resolve_tracking(cfg.tracking, cfg.store)[0])
    mlflow_run = next(ln.split()[2] for ln in out.splitlines() if ln.startswith("MLflow run:"))
    (failures,) = client.get_metric_history(mlflow_run, "infra_failures")
    (healthy,) = client.get_metric_history(mlflow_run, "healthy_fraction")
    assert failures.step == healthy.step == 1
    assert failures.value > 0 and 0.25 <= healthy.value < 1
    assert f"infra_failures={failures.value:.0f} healthy_fraction={healthy.value:.2f}" in err
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("executor failures at step 1: healthy fraction") for m in warned)
