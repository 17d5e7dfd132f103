"""The budget is a hard limit (docs/method.md §1.3): property tests over random episodes.

Random action sequences run through the runtime on the real-executor path (``OpenAIExecutor``
against a scripted OpenAI-compatible server on 127.0.0.1 that replies with tool tags and
reports its usage) and on the sim. After every action, what the executions report and what
the ledger books never exceed the episode's token total, tool calls, model calls and
environment steps, and the interactive per-node limits hold across a node's executions.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_server import JSONServer

from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.executors.base import EnvStep, NodeRequest
from evosteer_core.executors.openai import OpenAIExecutor, estimate_tokens
from evosteer_core.sim.executor import SimExecutor
from evosteer_core.sim.suite import make_sim_record
from evosteer_core.tools.search import BM25Retriever

CAT = default_catalogue()
TASKS = {
    "hotpotqa": TaskRecord("q1", "t", "hotpotqa", "Who founded Vemfus?", "qa_em", ("Ann",)),
    "alfworld": TaskRecord("g1", "t", "alfworld", "Put a mug in the sink.", "interactive"),
}
DOCS = [("d1", "Vemfus was founded by Ann."), ("d2", "Mugs go in sinks.")]


class LongEnv:
    """A world that is never won: each step is accepted; done after ``max_steps``."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps, self.steps_done, self.done, self.success = max_steps, 0, False, False

    def observe(self) -> str:
        return f"You are in room {self.steps_done}."

    def step(self, command: str) -> EnvStep:
        self.steps_done += 1
        self.done = self.steps_done >= self.max_steps
        return EnvStep(self.observe(), ok=True, done=self.done, success=False)

    def phase_fraction(self) -> float:
        return 0.0


class ScriptedServer:
    """Replies with a tool tag (search or act) or an answer, padded to a random length of at
    most ``max_tokens``, and reports usage: the prompt as the executor estimates it (times
    ``overcount``: a server whose tokenizer counts more) and the reply's length."""

    def __init__(self) -> None:
        self.rng = random.Random(0)
        self.overcount = 1.0
        self.max_tokens: list[int] = []

    def respond(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
        max_tokens = int(body["max_tokens"])
        self.max_tokens.append(max_tokens)
        prompt = sum(estimate_tokens(m["content"]) for m in body["messages"])
        kind = self.rng.choice(["<search>Vemfus founder</search>", "<act>go north</act>", ""])
        length = self.rng.randint(1, max_tokens)
        text = (kind + " Answer: Ann " + "x" * 4 * length)[: 4 * length]
        completion = estimate_tokens(text)
        finish = "length" if completion >= max_tokens else "stop"
        usage = {"prompt_tokens": int(prompt * self.overcount), "completion_tokens": completion}
        return 200, {
            "choices": [{"index": 0, "finish_reason": finish, "message": {"content": text}}],
            "usage": usage,
        }


class WorldExecutor(OpenAIExecutor):
    """The openai executor with a never-won environment for the interactive family."""

    def __init__(self, base_url: str, max_steps: int) -> None:
        super().__init__(
            base_url, "m", retriever=BM25Retriever(DOCS), send_seed=False, max_retries=0
        )
        self.env_max_steps = max_steps
        self.requests: list[NodeRequest] = []

    def make_environment(self, task: TaskRecord, seed_key: tuple[int, str]) -> LongEnv | None:
        return LongEnv(self.env_max_steps) if task.metric == "interactive" else None

    def run_node(self, request: NodeRequest):  # noqa: ANN201 - the base class's result
        self.requests.append(request)
        return super().run_node(request)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    with JSONServer(srv.respond) as http:
        srv.base_url = f"{http.root}/v1"  # type: ignore[attr-defined]
        yield srv


@st.composite
def limits_st(draw: st.DrawFn) -> BudgetLimits:
    """Small budgets: the token total covers one to six full solver reservations (so that
    episodes run into it), random call, step and action caps."""
    scale = draw(st.sampled_from([0.01, 0.02, 0.05, 0.1]))
    reservation = int(20_480 * scale) + int(12_288 * scale)
    return BudgetLimits(
        total_tokens=int(reservation * draw(st.floats(1.0, 6.0))),
        tool_calls=draw(st.integers(0, 8)),
        model_calls=draw(st.integers(1, 40)),
        max_actions=draw(st.integers(3, 24)),
        env_steps=draw(st.integers(1, 12)),
        node_env_steps=draw(st.integers(1, 6)),
        node_model_calls_interactive=draw(st.integers(1, 8)),
        token_scale=scale,
    )


def check_limits(ep: Episode, honest: bool = True) -> None:
    """The invariants, from what every execution reported and from the ledger. An ``honest``
    server reports no more than the executor estimated, so nothing is booked past the total;
    otherwise the ledger still stops at the total and keeps the rest as ``tokens_over``."""
    lim, led = ep.ledger.limits, ep.ledger
    results = [(o.node_id, o.result) for o in ep.history if o.result is not None]
    reported = sum(r.tokens_in + r.tokens_out for _, r in results)
    assert led.tokens <= lim.total_tokens
    assert reported <= lim.total_tokens or not honest
    assert sum(r.tool_calls for _, r in results) == led.tool_calls <= lim.tool_calls
    assert sum(r.model_calls for _, r in results) == led.model_calls <= lim.model_calls
    assert sum(r.env_steps for _, r in results) == led.env_steps <= lim.env_steps
    if ep.family.interactive:
        for nid in {n for n, _ in results}:
            mine = [r for n, r in results if n == nid]
            assert sum(r.env_steps for r in mine) <= lim.node_env_steps
            assert sum(r.model_calls for r in mine) <= lim.node_model_calls_interactive
    assert led.tokens + led.tokens_over == reported
    assert led.tokens_over == 0 or not honest


def executes(a: Action) -> bool:
    return a.kind in ("ADD_AGENT", "RERUN_AGENT", "BIND_SKILL") or a.protocol == "revise"


def run_random_episode(ep: Episode, picks: list[int], honest: bool = True) -> None:
    """Apply legal actions chosen by ``picks`` (cycled; three picks in four among the actions
    that execute a node, so that episodes run into their limits); check the limits after
    each."""
    t = 0
    while not ep.stopped:
        pick = picks[t % len(picks)]
        legal = ep.legal_actions()
        pool = [a for a in legal if executes(a)] if pick % 4 else []
        pool = pool or legal
        ep.apply(pool[pick % len(pool)])
        check_limits(ep, honest)
        t += 1


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    family=st.sampled_from(sorted(TASKS)),
    limits=limits_st(),
    picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=30),
    seed=st.integers(0, 2**16),
    env_max_steps=st.integers(5, 60),
    overcount=st.sampled_from([1.0, 1.0, 1.5, 4.0]),
)
def test_real_executor_path_never_exceeds_the_budget(
    server: ScriptedServer,
    family: str,
    limits: BudgetLimits,
    picks: list[int],
    seed: int,
    env_max_steps: int,
    overcount: float,
) -> None:
    server.rng, server.overcount = random.Random(seed), overcount
    ex = WorldExecutor(server.base_url, env_max_steps)  # type: ignore[attr-defined]
    ep = Episode(TASKS[family], CAT, limits, ex, lambda task, text, env: 0.0, episode_key="p")
    run_random_episode(ep, picks, honest=overcount == 1.0)
    for req in ex.requests:
        assert req.limits.max_total_tokens is not None and req.limits.max_total_tokens >= 0


@settings(max_examples=40, deadline=None)
@given(
    family=st.sampled_from(["hotpotqa", "aime", "mbpp_plus", "medqa", "alfworld"]),
    index=st.integers(0, 40),
    limits=limits_st(),
    picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=30),
)
def test_sim_path_never_exceeds_the_budget(
    family: str,
    index: int,
    limits: BudgetLimits,
    picks: list[int],
) -> None:
    task = make_sim_record(family, index, 0, "train")
    ep = Episode(task, CAT, limits, SimExecutor(), lambda t, x, e: 0.0, episode_key="s")
    run_random_episode(ep, picks)


def test_a_researcher_stops_calling_when_the_episode_tokens_run_out(server) -> None:
    """The issue's case: one reservation, several calls; the calls stop at the total."""
    server.rng, server.overcount = random.Random(3), 1.0
    ex = WorldExecutor(server.base_url, 10)
    limits = BudgetLimits(total_tokens=32_768 + 2_000, token_scale=1.0)
    ep = Episode(TASKS["hotpotqa"], CAT, limits, ex, lambda t, x, e: 0.0, episode_key="r")
    ep.apply(Action("ADD_AGENT", node_id="n0", role_id="researcher"))
    (req,) = ex.requests
    assert req.limits.max_total_tokens == 34_768
    assert all(m <= 12_288 for m in server.max_tokens)
    assert ep.ledger.tokens <= 34_768 and ep.ledger.tokens_over == 0


def test_usage_beyond_the_estimate_truncates_and_the_ledger_books_up_to_the_cap(server) -> None:
    """A server that counts 30x the estimated prompt: the execution stops at the reply that
    overruns, the ledger books up to the total and records the excess."""
    server.rng, server.overcount = random.Random(5), 30.0
    ex = WorldExecutor(server.base_url, 10)
    limits = BudgetLimits(total_tokens=1_100, token_scale=0.03)
    ep = Episode(TASKS["hotpotqa"], CAT, limits, ex, lambda t, x, e: 0.0, episode_key="o")
    obs = ep.apply(Action("ADD_AGENT", node_id="n0", role_id="researcher"))
    res = obs.result
    assert res.model_calls == 1 and res.tokens_in + res.tokens_out > 1_100
    assert (res.status, res.failure_kind) == ("truncated", "token_budget")
    assert ep.ledger.tokens == 1_100
    assert ep.ledger.tokens_over == res.tokens_in + res.tokens_out - 1_100
    assert ep.legal_actions() == [Action("SET_OUTPUT", node_id="n0")]


def test_the_decision_is_charged_before_its_node_runs() -> None:
    """The executed node gets what is left after the decision that chose it."""
    from evosteer_core.episode.runtime import DecisionCharge

    ex = SimExecutor()
    task = make_sim_record("aime", 1, 0, "train")
    seen: list[int | None] = []
    run = ex.run_node
    ex.run_node = lambda req: (seen.append(req.limits.max_total_tokens), run(req))[1]  # type: ignore[method-assign]
    ep = Episode(task, CAT, BudgetLimits(total_tokens=9_000, token_scale=0.1), ex, lambda *a: 0.0)
    ep.apply(Action("ADD_AGENT", node_id="n0", role_id="solver"), DecisionCharge(1_000, 20, 0.5))
    assert seen == [9_000 - 1_020]
    assert ep.ledger.wall_s == pytest.approx(0.5 + ep.history[0].result.latency_s)
