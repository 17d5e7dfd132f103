"""The openai executor against the fault-injecting server: every fault a model server can
inject is a classified result of ``run_node`` (docs/executors.md, "Result mapping"), never an
exception, and no call outlives its wall-clock deadline."""

from __future__ import annotations

import http.client
import socket
import time

import pytest
import requests
import urllib3
from fault_server import FaultServer

from evosteer_core.episode.budget import BudgetLedger, BudgetLimits
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.world import build_executor
from evosteer_core.executors.base import CallLimits, NodeRequest
from evosteer_core.executors.openai import OpenAIExecutor, estimate_tokens
from evosteer_core.infra.config import load_config

TASK = TaskRecord("t1", "unit", "aime", "What is 6 times 7?", "aime", answers=("42",))
TIMEOUT_S = 1.0


def node_request() -> NodeRequest:
    limits = CallLimits(
        max_model_calls=2,
        max_tool_calls=0,
        max_input_tokens=4096,
        max_output_tokens=256,
        max_total_tokens=12_288,
    )
    return NodeRequest(
        task=TASK,
        node_id="n0",
        role=default_catalogue().role("solver"),
        tools=(),
        skills=(),
        messages=(),
        previous_output=None,
        prompt="Task:\nWhat is 6 times 7?\n\nSolve it.",
        limits=limits,
        seed_key=(7, "ep", "n0", 0),
    )


def run(srv: FaultServer, retries: int = 1, timeout_s: float = TIMEOUT_S):
    """run_node against ``srv``; (result, seconds it took)."""
    ex = OpenAIExecutor(srv.base_url, "m", timeout_s=timeout_s, max_retries=retries, backoff_s=0.01)
    start = time.monotonic()
    result = ex.run_node(node_request())
    return result, time.monotonic() - start


def assert_infra(result, kind: str) -> None:
    assert (result.status, result.failure_kind) == ("infra_failure", kind)
    assert result.text == "" and result.answer is None


@pytest.mark.parametrize(("fault", "kind"), [("http_500", "http_500"), ("cut_off", "cut_off")])
def test_transient_faults_are_retried_then_classified(fault, kind):
    with FaultServer(fault) as srv:
        result, _ = run(srv, retries=2)
    assert_infra(result, kind)
    assert len(srv.log) == 3  # the first try and two retries


def test_a_reply_cut_off_mid_body_is_retried_and_the_retry_answers():
    """Before: requests' ChunkedEncodingError escaped run_node and crashed the rollout."""
    with FaultServer(["cut_off", "ok"]) as srv:
        result, _ = run(srv)
    assert (result.status, result.answer) == ("ok", "42")
    assert len(srv.log) == 2


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("http_401", "http_401"),
        ("malformed_json", "bad_response"),
        ("empty_choices", "bad_response"),
        ("content_int", "bad_response"),
    ],
)
def test_answers_that_are_not_chat_completions_are_not_retried(fault, kind):
    with FaultServer(fault) as srv:
        result, _ = run(srv, retries=2)
    assert_infra(result, kind)
    assert len(srv.log) == 1


def test_content_parts_are_joined():
    """Before: a list content raised TypeError out of run_node."""
    with FaultServer("content_parts", text="The answer is 42, so \\boxed{42}.") as srv:
        result, _ = run(srv)
    assert (result.status, result.answer) == ("ok", "42")
    assert result.text == "The answer is 42, so \\boxed{42}."


@pytest.mark.parametrize("fault", ["usage_not_int", "usage_negative"])
def test_invalid_usage_is_bad_response_charged_at_the_local_count(fault):
    """Before: "many" raised ValueError out of run_node, and -100000 prompt tokens were
    accepted, giving the episode budget back."""
    with FaultServer(fault, text="The answer is 42.") as srv:
        result, _ = run(srv)
    assert_infra(result, "bad_response")
    assert len(srv.log) == 1
    prompt = node_request().prompt
    assert (result.tokens_in, result.tokens_out) == (
        estimate_tokens(prompt),
        estimate_tokens("The answer is 42."),
    )
    assert result.model_calls == 1 and result.usage_estimated
    ledger = BudgetLedger(BudgetLimits(total_tokens=12_288))
    ledger.charge_node(result, "n0")
    assert ledger.tokens == result.tokens_in + result.tokens_out  # not 5 + NEGATIVE_PROMPT_TOKENS
    assert 0 < ledger.tokens_left < 12_288


@pytest.mark.parametrize("fault", ["hang", "drip"])
def test_no_call_outlives_its_wall_clock_deadline(fault):
    """A server that never answers, or sends one byte every 0.3 s (far below the per-read
    timeout), ends each try after timeout_s. Before: the drip kept a call alive until the
    whole reply was sent (minutes; here until the server's own deadline cut it)."""
    with FaultServer(fault, drip_s=0.3, deadline_s=8) as srv:
        result, seconds = run(srv, retries=1)
    assert_infra(result, "timeout")
    assert len(srv.log) == 2
    assert seconds < 2 * TIMEOUT_S + 0.8, seconds


def test_unreachable_is_classified():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    ex = OpenAIExecutor(f"http://127.0.0.1:{port}/v1", "m", max_retries=0, timeout_s=1)
    assert_infra(ex.run_node(node_request()), "unreachable")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (requests.exceptions.InvalidURL("bad"), "request_error"),
        (requests.exceptions.ContentDecodingError("gzip"), "cut_off"),
        (urllib3.exceptions.ProtocolError("unwrapped"), "unreachable"),
        (http.client.RemoteDisconnected("unwrapped"), "unreachable"),
        (TimeoutError("unwrapped"), "timeout"),
    ],
)
def test_every_error_of_the_http_stack_is_classified(exc, kind, monkeypatch):
    ex = OpenAIExecutor("http://127.0.0.1:9/v1", "m", max_retries=0)

    def post(*args, **kwargs):
        raise exc

    monkeypatch.setattr(ex._session, "post", post)
    assert_infra(ex.run_node(node_request()), kind)


def test_the_configured_api_key_is_sent_with_every_request(tmp_path, monkeypatch):
    """executor.api_key_env through build_executor: each request carries the bearer token."""
    monkeypatch.setenv("EVOSTEER_FAULT_KEY", "sk-fault-test")
    with FaultServer(["http_500", "ok"]) as srv:
        cfg = load_config(
            None,
            {
                "store.root": str(tmp_path),
                "executor.kind": "openai",
                "executor.base_url": srv.base_url,
                "executor.model": "m",
                "executor.api_key_env": "EVOSTEER_FAULT_KEY",
                "executor.backoff_s": 0.01,
            },
        )
        result = build_executor(cfg).run_node(node_request())
    assert result.status == "ok"
    assert [r.header("Authorization") for r in srv.log] == ["Bearer sk-fault-test"] * 2
    assert srv.log[0].path == "/v1/chat/completions" and srv.log[0].body["model"] == "m"


def test_the_fault_server_is_bounded():
    """It stops itself at its deadline and after max_requests, and close() ends a hanging
    handler at once."""
    with FaultServer("ok", deadline_s=0.3) as srv:
        time.sleep(0.6)
        assert srv.stopped
        with pytest.raises(requests.ConnectionError):
            requests.post(f"{srv.base_url}/chat/completions", json={}, timeout=1)
    with FaultServer("ok", max_requests=1) as srv:
        assert requests.post(f"{srv.base_url}/chat/completions", json={}, timeout=1).ok
        time.sleep(0.2)
        assert srv.stopped
    srv = FaultServer("hang", deadline_s=60)
    with srv:
        with pytest.raises(requests.Timeout):
            requests.post(f"{srv.base_url}/chat/completions", json={}, timeout=0.2)
        start = time.monotonic()
    assert time.monotonic() - start < 1.0
    with pytest.raises(ValueError, match="unknown faults"):
        FaultServer("teapot")
