"""The openai executor against a scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator

import pytest
from json_server import JSONServer

from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.executors.base import (
    CallLimits,
    EnvStep,
    Evidence,
    Executor,
    NodeRequest,
)
from evosteer_core.executors.openai import (
    ACT_BY_REPLY_HELP,
    ACT_DEMO,
    COMMAND_MAX_WORDS,
    TOOL_HELP,
    OpenAIExecutor,
    estimate_tokens,
    reply_command,
)
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.tools.search import BM25Retriever

CAT = default_catalogue()
TASK = TaskRecord("t1", "unit", "aime", "What is 6 times 7?", "aime", answers=("42",))


def reply(text: str, *, finish: str = "stop", usage: tuple[int, int] | None = (10, 5)) -> dict:
    body: dict = {"choices": [{"index": 0, "finish_reason": finish, "message": {"content": text}}]}
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
    return body


class FakeServer:
    """Answers each POST /v1/chat/completions with the next scripted (status, body) pair and
    records every request payload and the last request's headers."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict]] = []
        self.requests: list[dict] = []
        self.headers: dict[str, str] = {}
        self.base_url = ""

    def respond(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
        assert path == "/v1/chat/completions", path
        self.requests.append(body)
        self.headers = headers
        return self.script.pop(0)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    srv = FakeServer()
    with JSONServer(srv.respond) as http:
        srv.base_url = f"{http.root}/v1"
        yield srv


def request(
    role_id: str = "verifier",
    tools: tuple[str, ...] = ("python",),
    model_calls: int = 4,
    tool_calls: int = 3,
    environment=None,
    env_steps: int = 0,
) -> NodeRequest:
    limits = CallLimits(
        max_model_calls=model_calls,
        max_tool_calls=tool_calls,
        max_input_tokens=4096,
        max_output_tokens=256,
        max_env_steps=env_steps,
    )
    return NodeRequest(
        task=TASK,
        node_id="n0",
        role=CAT.role(role_id),
        tools=tools,
        skills=(),
        messages=(),
        previous_output=None,
        prompt="Role: verifier.\n\nTask:\nWhat is 6 times 7?\n\nPerform your role.",
        limits=limits,
        seed_key=(7, "ep", "n0", 0),
        environment=environment,
    )


def executor(fake: FakeServer, **kw) -> OpenAIExecutor:
    kw.setdefault("backoff_s", 0.01)
    return OpenAIExecutor(fake.base_url, "test-model", **kw)


def test_tool_loop_runs_python_and_search_and_records_everything(fake):
    retriever = BM25Retriever([("math", "Six times seven equals forty-two."), ("x", "Unrelated.")])
    fake.script = [
        (
            200,
            reply(
                "Let me compute.\n<python>\nprint(6 * 7)\n</python>\n<result>99</result>",
                usage=(40, 12),
            ),
        ),
        (200, reply("<search>six times seven</search>", usage=(70, 6))),
        (200, reply("Both agree. The answer is 42.", usage=(120, 9))),
    ]
    ex = executor(fake, retriever=retriever, api_key="sk-test")
    assert isinstance(ex, Executor) and ex.name == "openai"
    res = ex.run_node(request(tools=("python", "search")))
    assert res.status == "ok" and res.failure_kind is None
    assert res.text == "Both agree. The answer is 42." and res.answer == "42."
    assert (res.model_calls, res.tool_calls) == (3, 2)
    assert (res.tokens_in, res.tokens_out) == (40 + 70 + 120, 12 + 6 + 9)
    py, search = res.tool_uses
    assert (py.tool, py.query.strip(), py.ok) == ("python", "print(6 * 7)", True)
    assert py.result.startswith("42")
    assert search.tool == "search" and search.ok and "(math)" in search.result
    assert res.evidence == (
        Evidence("exec_check", True, "exit 0"),
        Evidence("retrieval", True, "math"),
    )
    # The conversation: tool help in the system prompt, the reply cut after the tool tag
    # (the model's invented <result> dropped), the real result sent back as the next user turn.
    second = fake.requests[1]["messages"]
    assert second[0]["role"] == "system" and "<python>" in second[0]["content"]
    assert second[2] == {
        "role": "assistant",
        "content": "Let me compute.\n<python>\nprint(6 * 7)\n</python>",
    }
    assert second[3]["role"] == "user" and second[3]["content"].startswith("<result>42")
    assert fake.requests[2]["messages"][-1]["content"].startswith("<result>[1] (math)")
    assert fake.headers["Authorization"] == "Bearer sk-test"


def test_each_call_sends_model_max_tokens_temperature_and_derived_seed(fake):
    fake.script = [(200, reply("The answer is 42"))]
    executor(fake, temperature=0.0).run_node(request())
    body = fake.requests[0]
    assert body["model"] == "test-model" and body["max_tokens"] == 256
    assert body["temperature"] == 0.0
    assert body["seed"] == derive_seed("openai", 7, "ep", "n0", 0, 0) % 2**31
    assert body["messages"][-1]["content"].startswith("Role: verifier.")


def test_failing_python_is_recorded_as_a_failed_exec_check(fake):
    fake.script = [
        (200, reply("<python>assert 6 * 7 == 41</python>")),
        (200, reply("It failed, so the answer is 42")),
    ]
    res = executor(fake).run_node(request())
    assert res.status == "ok" and res.tool_uses[0].ok is False
    assert "AssertionError" in res.tool_uses[0].result
    assert res.evidence == (Evidence("exec_check", False, "exit 1"),)


def test_tools_the_node_may_not_use_are_not_run(fake):
    fake.script = [(200, reply("<python>print(1)</python>"))]
    res = executor(fake).run_node(request(role_id="solver", tools=()))
    assert (res.model_calls, res.tool_calls, res.tool_uses) == (1, 0, ())
    assert len(fake.requests) == 1 and fake.requests[0]["messages"][0]["role"] == "user"


def test_tool_and_model_call_limits_end_the_loop(fake):
    fake.script = [(200, reply(f"<python>print({i})</python>")) for i in range(4)]
    res = executor(fake).run_node(request(model_calls=4, tool_calls=2))
    assert (res.model_calls, res.tool_calls) == (3, 2)  # third reply's tool call is over budget
    fake.script = [(200, reply(f"<python>print({i})</python>")) for i in range(4)]
    res = executor(fake).run_node(request(model_calls=2, tool_calls=3))
    assert (res.model_calls, res.tool_calls) == (2, 1)  # no tool run whose result nobody reads


def test_5xx_is_retried_then_succeeds(fake):
    fake.script = [(503, {"error": "overloaded"}), (502, {}), (200, reply("The answer is 42"))]
    res = executor(fake, max_retries=2).run_node(request())
    assert res.status == "ok" and res.answer == "42" and len(fake.requests) == 3
    assert res.model_calls == 1 and (res.tokens_in, res.tokens_out) == (10, 5)


def test_5xx_beyond_the_retry_budget_is_an_infra_failure(fake):
    fake.script = [(500, {})] * 3
    res = executor(fake, max_retries=1).run_node(request())
    assert (res.status, res.failure_kind) == ("infra_failure", "http_500")
    assert res.answer is None and res.text == "" and len(fake.requests) == 2


def test_4xx_is_not_retried(fake):
    fake.script = [(400, {"detail": "bad model"}), (200, reply("never sent"))]
    res = executor(fake, max_retries=3).run_node(request())
    assert (res.status, res.failure_kind) == ("infra_failure", "http_400")
    assert len(fake.requests) == 1


def test_unreachable_server_is_an_infra_failure_not_an_answer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    ex = OpenAIExecutor(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, backoff_s=0.01)
    res = ex.run_node(request())
    assert (res.status, res.failure_kind) == ("infra_failure", "unreachable")
    assert res.answer is None and res.model_calls == 0


def test_malformed_reply_is_an_infra_failure(fake):
    fake.script = [(200, {"choices": []})]
    res = executor(fake).run_node(request())
    assert (res.status, res.failure_kind) == ("infra_failure", "bad_response")


def test_missing_usage_is_estimated_and_flagged(fake):
    fake.script = [(200, reply("The answer is 42", usage=None))]
    res = executor(fake).run_node(request())
    assert (res.status, res.failure_kind, res.usage_estimated) == ("ok", None, True)
    sent = fake.requests[0]["messages"]
    assert res.tokens_in == sum((len(m["content"]) + 3) // 4 for m in sent)  # 4 chars per token
    assert res.tokens_out == (len("The answer is 42") + 3) // 4
    # The note is independent of the status; reported usage is never flagged.
    fake.script = [(200, reply("The answer is", finish="length", usage=None))]
    cut = executor(fake).run_node(request())
    assert (cut.status, cut.failure_kind, cut.usage_estimated) == (
        "truncated",
        "output_budget",
        True,
    )
    fake.script = [(200, reply("The answer is 42"))]
    assert not executor(fake).run_node(request()).usage_estimated


def test_length_finish_is_truncated_and_its_tool_call_not_run(fake):
    fake.script = [(200, reply("<python>print(1)</python> and so on", finish="length"))]
    res = executor(fake).run_node(request())
    assert (res.status, res.failure_kind) == ("truncated", "output_budget")
    assert res.tool_calls == 0 and res.model_calls == 1


def _with_total(req: NodeRequest, total: int) -> NodeRequest:
    return dataclasses.replace(req, limits=dataclasses.replace(req.limits, max_total_tokens=total))


def test_each_call_gets_at_most_the_tokens_the_episode_has_left(fake):
    fake.script = [
        (200, reply("<python>print(6 * 7)</python>", usage=(100, 50))),
        (200, reply("The answer is", finish="length", usage=(160, 60))),
    ]
    res = executor(fake).run_node(_with_total(request(), 400))
    first, second = fake.requests
    first_prompt = sum(estimate_tokens(m["content"]) for m in first["messages"])
    result_est = estimate_tokens(second["messages"][-1]["content"])
    # call 1: all 256 fit; call 2: 400 - 150 spent - (150 + the result's estimate) of input
    assert first_prompt + 256 <= 400
    assert [r["max_tokens"] for r in fake.requests] == [256, 400 - 150 - (150 + result_est)]
    assert (res.status, res.failure_kind) == ("truncated", "token_budget")  # cut by the budget
    assert res.tokens_in + res.tokens_out == 370 and res.tool_calls == 1


def test_a_tool_call_no_later_call_could_read_is_not_run(fake):
    fake.script = [(200, reply("<python>print(1)</python>", usage=(100, 50)))]
    res = executor(fake).run_node(_with_total(request(), 300))
    assert (res.status, res.failure_kind) == ("truncated", "token_budget")
    assert res.tool_calls == 0 and res.model_calls == 1 and len(fake.requests) == 1


def test_no_tokens_left_for_the_prompt_makes_no_call(fake):
    res = executor(fake).run_node(_with_total(request(), 10))
    assert (res.status, res.failure_kind) == ("truncated", "token_budget")
    assert res.model_calls == 0 and fake.requests == []


class CounterEnvironment:
    """A three-step world: ``inc`` raises a counter; the episode is won at 3."""

    def __init__(self) -> None:
        self.max_steps, self.steps_done, self.done, self.success = 5, 0, False, False
        self.count = 0

    def observe(self) -> str:
        return f"counter={self.count}"

    def step(self, command: str) -> EnvStep:
        self.steps_done += 1
        ok = command == "inc"
        self.count += ok
        self.done = self.success = self.count >= 3
        return EnvStep(self.observe(), ok, self.done, self.success)

    def phase_fraction(self) -> float:
        return self.count / 3


def test_environment_actions_are_stepped_and_observations_returned(fake):
    env = CounterEnvironment()
    fake.script = [
        (200, reply("<act>inc</act>")),
        (200, reply("<act>jump</act>")),
        (200, reply("<act>inc</act>")),
        (200, reply("<act>inc</act>")),
        (200, reply("<act>inc</act>")),
    ]
    res = executor(fake).run_node(
        request(role_id="solver", tools=(), model_calls=6, environment=env, env_steps=4)
    )
    assert [u.query for u in res.tool_uses] == ["inc", "jump", "inc", "inc"]
    assert res.env_steps == 4 and res.tool_calls == 0 and env.success
    assert res.env_last_ok is True and res.model_calls == 5  # the world is done: 5th act not run
    assert "counter=0" in fake.requests[0]["messages"][-1]["content"]
    assert fake.requests[2]["messages"][-1]["content"] == "<result>counter=1</result>"


def test_no_model_calls_left_fails_without_calling(fake):
    res = executor(fake).run_node(request(model_calls=0))
    assert (res.status, res.failure_kind) == ("failed", "no_model_calls_left")
    assert fake.requests == []


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="base_url"):
        OpenAIExecutor("localhost:8000", "m")
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIExecutor("http://127.0.0.1:1/v1", "m", max_retries=-1)


def _demo_messages() -> list[dict[str, str]]:
    """ACT_DEMO as the conversation shows it: observations framed as real ones are."""
    out = []
    for i, (shown, command) in enumerate(ACT_DEMO):
        content = f"<result>{shown}</result>" if i else f"Environment observation:\n{shown}"
        out += [{"role": "user", "content": content}, {"role": "assistant", "content": command}]
    return out


def test_an_interactive_reply_without_a_tag_is_one_command(fake):
    env = CounterEnvironment()
    fake.script = [
        (200, reply("> inc\nThe counter rises to 1.")),
        (200, reply("Command: `inc`.")),
        (200, reply('  "jump"  ')),
        (200, reply("**inc**")),
        (200, reply("inc")),  # the world is done: not run
    ]
    req = request(role_id="solver", tools=(), model_calls=6, environment=env, env_steps=5)
    res = executor(fake).run_node(req)
    assert [u.query for u in res.tool_uses] == ["inc", "inc", "jump", "inc"]
    assert [u.ok for u in res.tool_uses] == [True, True, False, True]
    assert res.env_steps == env.steps_done == 4 and res.tool_calls == 0 and env.success
    assert res.model_calls == 5 and (res.status, res.text) == ("ok", "inc")
    first = fake.requests[0]["messages"]
    assert first[0] == {
        "role": "system",
        "content": ACT_BY_REPLY_HELP
        + "\nUse at most one tool call per reply and wait for its result.",
    }
    assert first[1:-1] == _demo_messages()
    assert first[-1] == {
        "role": "user",
        "content": req.prompt + "\n\nEnvironment observation:\ncounter=0",
    }
    # the reply is kept up to its command line; the observation goes back as the next turn
    assert fake.requests[1]["messages"][-2:] == [
        {"role": "assistant", "content": "> inc"},
        {"role": "user", "content": "<result>counter=1</result>"},
    ]
    assert fake.requests[3]["messages"][-2]["content"] == '  "jump"  '


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("go north", "go north"),
        ("\n\n  > open fridge  \nYou open the fridge.", "open fridge"),
        ("Action: take apple from fridge.", "take apple from fridge"),
        ("COMMAND:'unlock chest with key'", "unlock chest with key"),
        (" ".join(["w"] * COMMAND_MAX_WORDS), " ".join(["w"] * COMMAND_MAX_WORDS)),
        (" ".join(["w"] * (COMMAND_MAX_WORDS + 1)), None),
        ("", None),
        (" \n\t\n", None),
        ("> ...", None),
        ("<python>print(1)", None),  # a tool call, even unclosed, is not a command
        ("go north <act>go south</act>", None),
    ],
)
def test_a_bare_command_is_the_first_line_if_it_is_short(text, command):
    found = reply_command(text)
    assert (found[0] if found else None) == command
    if found:
        assert command in text[: found[1]] and "\n" not in text[: found[1]].strip()


def test_the_planner_and_tasks_without_a_world_keep_the_tag_protocol(fake):
    # no environment: a short reply is the node's output, the conversation is unchanged
    fake.script = [(200, reply("42")), (200, reply("The answer is 42."))]
    res = executor(fake).run_node(request(role_id="solver", tools=(), model_calls=3))
    assert res.model_calls == 1 and res.env_steps == 0 and res.text == "42"
    assert fake.requests[0]["messages"] == [{"role": "user", "content": request().prompt}]
    res = executor(fake).run_node(request())  # the verifier's python line only, no demo
    assert [m["role"] for m in fake.requests[1]["messages"]] == ["system", "user"]
    assert fake.requests[1]["messages"][0]["content"].startswith(TOOL_HELP["python"])
    # the planner writes plans: a short line is not a command; an explicit <act> still is
    env = CounterEnvironment()
    fake.requests.clear()
    fake.script = [(200, reply("inc")), (200, reply("<act>inc</act>")), (200, reply("Plan."))]
    planner = request(role_id="planner", tools=(), model_calls=3, environment=env, env_steps=3)
    res = executor(fake).run_node(planner)
    assert res.model_calls == 1 and env.steps_done == 0
    assert [m["role"] for m in fake.requests[0]["messages"]] == ["system", "user"]
    assert fake.requests[0]["messages"][0]["content"].startswith(TOOL_HELP["act"])
    res = executor(fake).run_node(planner)
    assert [u.query for u in res.tool_uses] == ["inc"] and res.model_calls == 2


def test_bare_commands_stop_at_the_step_call_and_token_limits(fake):
    env = CounterEnvironment()
    fake.script = [(200, reply("jump"))] * 3
    res = executor(fake).run_node(
        request(role_id="solver", tools=(), model_calls=5, environment=env, env_steps=2)
    )
    assert res.env_steps == env.steps_done == 2 and res.model_calls == 3  # no step left
    fake.script = [(200, reply("jump"))] * 2
    res = executor(fake).run_node(
        request(role_id="solver", tools=(), model_calls=2, environment=env, env_steps=5)
    )
    assert res.env_steps == 1 and res.model_calls == 2  # the last allowed reply is not run
    # no later call could read the observation: the command is not sent, the budget holds
    fake.requests.clear()
    fake.script = [(200, reply("jump", usage=(150, 5)))]
    req = _with_total(
        request(role_id="solver", tools=(), model_calls=5, environment=env, env_steps=5), 300
    )
    res = executor(fake).run_node(req)
    assert sum(estimate_tokens(m["content"]) for m in fake.requests[0]["messages"]) < 300
    assert (res.status, res.failure_kind) == ("truncated", "token_budget")
    assert res.env_steps == 0 and env.steps_done == 3 and res.tokens_in + res.tokens_out == 155
