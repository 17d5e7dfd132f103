"""One answer rule in both executors (issue 11 item 7): the same output texts, read by the sim
executor's accounting and by the openai executor behind a scripted 127.0.0.1 server, state the
same answers, so execution features 15 and 17 mean the same thing on either backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from json_server import JSONServer

from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.executors.base import CallLimits, NodeRequest
from evosteer_core.executors.openai import OpenAIExecutor
from evosteer_core.sim import DEFAULT_MODEL, SimExecutor
from evosteer_core.sim.executor import _Call, _Work

CAT = default_catalogue()
META = {"difficulty": 0.5}
MATH = TaskRecord("m", "sim", "aime", "What is 6 times 7?", "qa_em", answers=("42",), meta=META)
CODE = TaskRecord(
    "c",
    "sim",
    "mbpp_plus",
    "Write f.",
    "code",
    tests="assert f() == 1\n",
    entry_point="f",
    meta=META,
)
EXPLICIT = ("solver", "verifier", "researcher", "finalizer")
PLAN = "Plan:\n1. Read the task carefully.\n2. Multiply 6 by 7.\n3. State the result."
FENCED = "The function:\n```python\ndef f():\n    return 1\n```"

# (text, task, role) -> the stated answer; every role absent from a row's dict states None
TABLE: list[tuple[str, TaskRecord, dict[str, str]]] = [
    (PLAN, MATH, {"tool_user": "3. State the result."}),
    ("Plan:\n1. Multiply.\nAnswer: 42", MATH, dict.fromkeys(EXPLICIT + ("tool_user",), "42")),
    ("Work.\nAnswer: 42", MATH, dict.fromkeys(EXPLICIT + ("tool_user",), "42")),
    ("It is \\boxed{42}.\nAnswer: 41", MATH, dict.fromkeys(EXPLICIT + ("tool_user",), "42")),
    ("I multiplied.\n42", MATH, {"tool_user": "42"}),
    ("The answer is 42.", MATH, dict.fromkeys(EXPLICIT + ("tool_user",), "42.")),
    (FENCED, MATH, {"tool_user": "```"}),
    (FENCED, CODE, dict.fromkeys(EXPLICIT + ("tool_user",), "def f():\n    return 1")),
    ("No idea yet", CODE, {"tool_user": "No idea yet"}),
]
ROLES = tuple(r.role_id for r in CAT.roles)
CASES = [(text, task, role, row.get(role)) for text, task, row in TABLE for role in ROLES]


def _request(task: TaskRecord, role_id: str) -> NodeRequest:
    limits = CallLimits(
        max_model_calls=1, max_tool_calls=0, max_input_tokens=4096, max_output_tokens=2048
    )
    return NodeRequest(
        task=task,
        node_id="n0",
        role=CAT.role(role_id),
        tools=(),
        skills=(),
        messages=(),
        previous_output=None,
        prompt=f"Role: {role_id}.\n\nTask:\n{task.prompt}\n\nPerform your role.",
        limits=limits,
        seed_key=(3, "ep", "n0", 0),
    )


def _sim_answer(text: str, task: TaskRecord, role_id: str) -> str | None:
    """The sim executor's accounting of an execution whose text is ``text`` (mishaps off, so
    the status is ok as in the openai case)."""
    sim = SimExecutor(dataclasses.replace(DEFAULT_MODEL, ramble=0.0, parse_error=0.0))
    req = _request(task, role_id)
    result = sim._account(_Call(req, sim.model.families[task.family]), _Work(body=text), 10)
    assert result.status == "ok" and result.text == text
    return result.answer


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[OpenAIExecutor, list[str]]]:
    """An openai executor whose server replies with the next scripted text."""
    script: list[str] = []

    def respond(path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
        message = {"content": script.pop(0)}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        return 200, {"choices": [choice], "usage": {"prompt_tokens": 9, "completion_tokens": 9}}

    with JSONServer(respond) as http:
        yield OpenAIExecutor(f"{http.root}/v1", "test-model", backoff_s=0.01), script


@pytest.mark.parametrize(("text", "task", "role", "expected"), CASES)
def test_both_executors_state_the_same_answer(server, text, task, role, expected) -> None:
    executor, script = server
    script.append(text)
    real = executor.run_node(_request(task, role))
    assert real.status == "ok" and real.text == text
    assert real.answer == expected
    assert _sim_answer(text, task, role) == expected


def test_sim_texts_state_the_answers_the_sim_chose() -> None:
    """Over real sim executions of every role, the answer read from the text is the one the
    role's behaviour produced (the planner's plans included: never an answer)."""
    from evosteer_core.sim import make_sim_suite

    sim = SimExecutor()
    answered = 0
    for task in make_sim_suite(6, 2, "train"):
        if task.family == "alfworld":
            continue
        for role in CAT.roles_for(task.family):
            res = sim.run_node(_request(task, role.role_id))
            if role.role_id == "planner":
                assert res.answer is None and res.text.startswith("Plan:")
            elif res.status == "ok":
                assert res.text.rstrip().endswith(f"Answer: {res.answer}")
                answered += 1
    assert answered > 100
