"""The ``openai`` executor: nodes run on any OpenAI-compatible chat-completions server.

vLLM or SGLang serve it in production, ``transformers serve`` on a CPU. One node execution is
a short conversation: the node prompt, then model replies; a reply carrying a tool tag
(``<python>``, ``<search>``, ``<act>``) that the node may use is executed and the outcome is
sent back as ``<result>…</result>``, until the reply has no tool call or the node's limits
are spent. In an interactive task a role that acts may also reply with a bare command
(:func:`reply_command`), after a short demonstration of that protocol (:data:`ACT_DEMO`).
The protocol, retry policy and failure mapping are in docs/executors.md.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from evosteer_core.episode.answers import stated_answer
from evosteer_core.episode.records import TaskRecord
from evosteer_core.executors.base import (
    CallLimits,
    Environment,
    Evidence,
    NodeRequest,
    NodeResult,
    ToolUse,
)
from evosteer_core.infra.redact import redact_text, redact_url
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.tools.sandbox import SandboxLimits, format_run, run_python
from evosteer_core.tools.search import RESULT_CHARS, Retriever, RetrieverError, format_passages

_TOOL_TAG = re.compile(r"<(python|search|act)>(.*?)</\1>", re.DOTALL)
_TOOL_OPEN = re.compile(r"<(python|search|act)>")
_FIRST_LINE = re.compile(r"\S[^\n]*")
_COMMAND_LABEL = re.compile(r"^(?:>+|(?:command|action)\s*:)\s*", re.IGNORECASE)
_FENCED = re.compile(r"^\s*```[^\n]*\n(.*?)\n?```\s*$", re.DOTALL)
_OBSERVATION = "Environment observation:\n"
_RETRY_STATUS = frozenset({429}) | frozenset(range(500, 600))
_RETRY_KINDS = frozenset({"timeout", "unreachable", "cut_off"})
_BACKOFF_CAP_S = 30.0
_ABORT_POLL_S = 0.05
_BODY_ERRORS = (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)
_TIMEOUTS = (requests.Timeout, TimeoutError, urllib3.exceptions.TimeoutError)
_HTTP_ERRORS = (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError)
"""What one exchange can raise besides an answer (requests' exceptions are OSErrors)."""

TOOL_HELP = {
    "python": "To run Python, write <python>code</python>; the program's output comes back "
    "as <result>...</result>.",
    "search": "To search, write <search>query</search>; passages come back as "
    "<result>...</result>.",
    "act": "To act in the environment, write <act>command</act>; the observation comes back "
    "as <result>...</result>.",
}
"""System-prompt lines that teach the tool tags; only the node's own tools are shown."""

ACT_BY_REPLY_HELP = (
    "To act in the environment, reply with one command, such as open fridge, or write "
    "<act>command</act>; the observation comes back as <result>...</result>."
)
"""The ``act`` line for a role that acts by reply (:func:`acts_by_reply`)."""

ACT_DEMO: tuple[tuple[str, str], ...] = (
    (
        "-= Kitchen =-\nYou are in a kitchen. You see a closed fridge. There is an exit to "
        "the north.",
        "open fridge",
    ),
    ("You open the fridge, revealing an apple.", "take apple"),
    ("You take the apple from the fridge.", "go north"),
)
"""(observation, command) turns of an invented household game, shown before the node prompt
of a role that acts by reply, framed as real turns are; a small model imitates the replies'
form (docs/executors.md, "Commands without a tag")."""

COMMAND_MAX_WORDS = 12
"""The longest bare reply line read as a command; a longer one is prose (TextWorld's longest
commands, ``unlock <name> with <name>``, had 10 words over the built-in suite's levels)."""

EnvironmentFactory = Callable[[TaskRecord, tuple[int, str]], "Environment | None"]


@dataclass(frozen=True)
class ChatReply:
    """One chat completion: text, finish reason, and token usage (estimated when absent)."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    usage_estimated: bool


class InfraFailure(RuntimeError):
    """The model server could not give a usable reply; ``kind`` goes to ``failure_kind``.

    ``charge`` is the (estimated) usage of a call the server did answer, such as a reply whose
    usage is invalid: the episode still pays for it."""

    def __init__(self, kind: str, detail: str, charge: ChatReply | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.charge = charge


class _Deadline:
    """The wall-clock limit of one HTTP exchange: once it passes, a thread shuts down the
    socket of the connection the exchange uses (which ends a read that per-read timeouts
    never end, such as a server sending a byte every second) until the exchange ends."""

    def __init__(self, seconds: float) -> None:
        self.conn: Any = None  # set by _WatchedPool when the exchange gets its connection
        self.expired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(seconds,), daemon=True)
        self._thread.start()

    def _watch(self, seconds: float) -> None:
        if self._done.wait(seconds):
            return
        self.expired = True
        while True:  # the connection may not be open yet: keep trying until the call ends
            sock = getattr(self.conn, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            if self._done.wait(_ABORT_POLL_S):
                return

    def end(self) -> None:
        self._done.set()
        self._thread.join()


_ACTIVE = threading.local()
"""``deadline``: the :class:`_Deadline` of this thread's exchange in progress, if any."""


class _WatchedPool:
    """Mixin for urllib3 pools: hands each connection taken out to the thread's deadline."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        deadline = getattr(_ACTIVE, "deadline", None)
        if deadline is not None:
            deadline.conn = conn
        return conn


class _WatchedHTTPPool(_WatchedPool, HTTPConnectionPool):
    pass


class _WatchedHTTPSPool(_WatchedPool, HTTPSConnectionPool):
    pass


class _DeadlineAdapter(HTTPAdapter):
    """requests' adapter with pools whose connections a :class:`_Deadline` can abort."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _WatchedHTTPPool,
            "https": _WatchedHTTPSPool,
        }


def _request_failure(exc: Exception, expired: bool, url: str) -> InfraFailure:
    """The failure kind of an exchange that raised (docs/executors.md, "Result mapping"):
    a ``requests`` exception, or an OS, ``http.client`` or urllib3 error that got past it."""
    cause = exc.args[0] if exc.args else None
    if expired or isinstance(exc, _TIMEOUTS) or isinstance(cause, _TIMEOUTS):
        kind = "timeout"
    elif isinstance(exc, _BODY_ERRORS):
        kind = "cut_off"  # the reply's body ended early or could not be decoded
    elif isinstance(exc, requests.RequestException) and not isinstance(
        exc, requests.ConnectionError
    ):
        kind = "request_error"
    else:
        kind = "unreachable"
    return InfraFailure(kind, redact_text(f"{url}: {type(exc).__name__}: {exc}")[:500])


def _content_text(content: object) -> str:
    """A message's text: a string, null (no text), or a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise TypeError(f"message content must be a string or a list of text parts, got {content!r}")


def _usage_tokens(usage: object) -> tuple[int, int] | None:
    """(prompt, completion) tokens a server reported; None when it reported none."""
    if not isinstance(usage, dict):
        raise TypeError(f"usage must be an object, got {usage!r}")
    if "prompt_tokens" not in usage or "completion_tokens" not in usage:
        return None
    counts = usage["prompt_tokens"], usage["completion_tokens"]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        raise ValueError(f"usage tokens must be non-negative integers, got {usage!r}")
    return counts


@dataclass(frozen=True)
class _ToolCall:
    """A tool call found in a reply; the reply is kept up to ``end`` in the conversation."""

    kind: str
    body: str
    end: int


@dataclass
class _Turn:
    """Mutable accounting of one node execution."""

    tokens_in: int = 0
    tokens_out: int = 0
    model_calls: int = 0
    last_context: int = 0
    tool_calls: int = 0
    env_steps: int = 0
    env_last_ok: bool | None = None
    usage_estimated: bool = False
    tool_failed: bool = False
    tool_uses: list[ToolUse] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)

    def charge(self, reply: ChatReply) -> None:
        self.model_calls += 1
        self.tokens_in += reply.prompt_tokens
        self.tokens_out += reply.completion_tokens
        self.last_context = reply.prompt_tokens + reply.completion_tokens
        self.usage_estimated |= reply.usage_estimated


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters per token) for servers that report no usage."""
    return max(1, (len(text) + 3) // 4)


def acts_by_reply(request: NodeRequest) -> bool:
    """Whether a reply without a tool tag is a command: in an interactive task, for every
    role that states answers (not the planner, whose replies are plans; as in the sim)."""
    return request.environment is not None and request.role.answer_form != "none"


def reply_command(text: str) -> tuple[str, int] | None:
    """The command a reply without any tool tag states, and where it ends in ``text``: its
    first non-empty line without a leading ``>``/``Command:``/``Action:`` and surrounding
    quotes, backticks, asterisks or periods, if that has 1 to :data:`COMMAND_MAX_WORDS`
    words (how text-game agents commonly read a model's action)."""
    if _TOOL_OPEN.search(text):
        return None
    line = _FIRST_LINE.search(text)
    if line is None:
        return None
    command = _COMMAND_LABEL.sub("", line.group()).strip(" \t\"'`*.")
    if not command or len(command.split()) > COMMAND_MAX_WORDS:
        return None
    return command, line.end()


class OpenAIExecutor:
    """Runs nodes against ``{base_url}/chat/completions`` (``base_url`` ends in ``/v1``)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        temperature: float = 0.3,
        send_seed: bool = True,
        retriever: Retriever | None = None,
        sandbox: SandboxLimits | None = None,
        environment_factory: EnvironmentFactory | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"openai executor: base_url must be http(s)://..., got {base_url!r}")
        if max_retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError(
                "openai executor: need max_retries >= 0, backoff_s >= 0, timeout_s > 0; got "
                f"{max_retries}, {backoff_s}, {timeout_s}"
            )
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.temperature = temperature
        self.send_seed = send_seed
        self.retriever = retriever
        self.sandbox = sandbox or SandboxLimits()
        self.environment_factory = environment_factory
        self._session = requests.Session()
        for prefix in ("http://", "https://"):
            self._session.mount(prefix, _DeadlineAdapter())
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"

    # --- protocol ----------------------------------------------------------------------
    def make_environment(self, task: TaskRecord, seed_key: tuple[int, str]) -> Environment | None:
        """The interactive world for ``task``, from the configured factory (None without one)."""
        if self.environment_factory is None:
            return None
        return self.environment_factory(task, seed_key)

    def run_node(self, request: NodeRequest) -> NodeResult:
        """One node execution; its answer follows ``answers.stated_answer``, the rule the sim
        executor uses too (docs/runtime.md)."""
        result = self._execute(request)
        answer = stated_answer(result.text, request.role, request.task, result.status)
        return replace(result, answer=answer)

    def _execute(self, request: NodeRequest) -> NodeResult:
        start = time.monotonic()
        turn = _Turn()
        limits = request.limits
        if limits.max_model_calls <= 0:
            return self._result(turn, "", start, "failed", "no_model_calls_left")
        tools = self._usable_tools(request)
        messages = self._opening(request, tools)
        text, status, failure = "", "ok", None
        try:
            while True:
                prompt_tokens = self._prompt_estimate(messages, turn)
                if prompt_tokens > limits.max_input_tokens:
                    status, failure = "truncated", "input_budget"
                    break
                room = self._room(limits, turn) - prompt_tokens
                if room < 1:
                    status, failure = "truncated", "token_budget"
                    break
                max_tokens = int(min(limits.max_output_tokens, room))
                reply = self.chat(messages, max_tokens, self._seed(request, turn.model_calls))
                turn.charge(reply)
                text = reply.text
                if self._room(limits, turn) < 0:
                    status, failure = "truncated", "token_budget"  # usage beyond the estimate
                    break
                if reply.finish_reason == "length":
                    budget_cut = max_tokens < limits.max_output_tokens
                    status, failure = "truncated", "token_budget" if budget_cut else "output_budget"
                    break
                call = self._next_tool(text, tools, turn, request)
                if call is None or turn.model_calls >= limits.max_model_calls:
                    break
                if self._room(limits, turn) <= turn.last_context:
                    # no later call could read the tool's result
                    status, failure = "truncated", "token_budget"
                    break
                messages.append({"role": "assistant", "content": text[: call.end]})
                result = self._run_tool(call.kind, call.body, turn, request)
                messages.append({"role": "user", "content": f"<result>{result}</result>"})
        except InfraFailure as exc:
            if exc.charge is not None:
                turn.charge(exc.charge)
            return self._result(turn, "", start, "infra_failure", exc.kind)
        if status == "ok" and turn.tool_failed:
            status, failure = "tool_error", "tool_unavailable"
        return self._result(turn, text, start, status, failure)

    # --- one model call ----------------------------------------------------------------
    def chat(self, messages: list[dict[str, str]], max_tokens: int, seed: int | None) -> ChatReply:
        """One chat completion with bounded retries (connection errors, timeouts, cut-off
        replies, 429, 5xx); each attempt ends within ``timeout_s`` of wall-clock time."""
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
        }
        if seed is not None:
            payload["seed"] = seed
        last = InfraFailure("unreachable", redact_url(self.url))
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(_BACKOFF_CAP_S, self.backoff_s * 2 ** (attempt - 1)))
            try:
                status, body = self._post(payload)
            except InfraFailure as exc:
                if exc.kind not in _RETRY_KINDS:
                    raise
                last = exc
                continue
            detail = body[:300].decode("utf-8", "replace")
            if status in _RETRY_STATUS:
                last = InfraFailure(f"http_{status}", detail)
                continue
            if status != 200:
                raise InfraFailure(f"http_{status}", detail)
            return self._parse(body, messages)
        raise last

    def _post(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        """One HTTP exchange, ended after ``timeout_s`` of wall-clock time: (status, body).
        Every ``requests`` exception becomes an :class:`InfraFailure`."""
        deadline = _Deadline(self.timeout_s)
        _ACTIVE.deadline = deadline
        try:
            with self._session.post(
                self.url, json=payload, timeout=self.timeout_s, stream=True
            ) as response:
                return response.status_code, response.content
        except _HTTP_ERRORS as exc:
            raise _request_failure(exc, deadline.expired, self.url) from exc
        finally:
            _ACTIVE.deadline = None
            deadline.end()

    @staticmethod
    def _parse(body: bytes, messages: list[dict[str, str]]) -> ChatReply:
        """The reply in a 200 body; anything but a chat completion with a string (or text
        parts) content and non-negative integer usage is ``bad_response``."""
        try:
            data = json.loads(body)
            choice = data["choices"][0]
            text = _content_text(choice["message"].get("content"))
            finish = choice.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise InfraFailure("bad_response", f"{exc}: {body[:300]!r}") from exc
        prompt = sum(estimate_tokens(m["content"]) for m in messages)
        estimated = ChatReply(text, finish, prompt, estimate_tokens(text), True)
        try:
            usage = _usage_tokens(data.get("usage") or {})
        except (ValueError, TypeError) as exc:
            raise InfraFailure("bad_response", str(exc)[:300], charge=estimated) from exc
        if usage is None:
            return estimated
        return ChatReply(text, finish, *usage, False)

    # --- the tool loop -----------------------------------------------------------------
    def _usable_tools(self, request: NodeRequest) -> tuple[str, ...]:
        tools = [t for t in request.tools if t in ("python", "search")]
        if "search" in tools and self.retriever is None:
            tools.remove("search")
        if request.environment is not None:
            tools.append("act")
        return tuple(tools)

    @staticmethod
    def _opening(request: NodeRequest, tools: tuple[str, ...]) -> list[dict[str, str]]:
        prompt = request.prompt
        if request.environment is not None:
            prompt += f"\n\n{_OBSERVATION}{request.environment.observe()}"
        by_reply = acts_by_reply(request)
        messages = []
        if tools:
            lines = [ACT_BY_REPLY_HELP if t == "act" and by_reply else TOOL_HELP[t] for t in tools]
            lines.append("Use at most one tool call per reply and wait for its result.")
            messages.append({"role": "system", "content": "\n".join(lines)})
        if by_reply:
            for i, (observation, command) in enumerate(ACT_DEMO):
                shown = f"<result>{observation}</result>" if i else f"{_OBSERVATION}{observation}"
                messages.append({"role": "user", "content": shown})
                messages.append({"role": "assistant", "content": command})
        messages.append({"role": "user", "content": prompt})
        return messages

    @staticmethod
    def _room(limits: CallLimits, turn: _Turn) -> float:
        """Tokens this execution may still spend (input + output of its remaining calls)."""
        if limits.max_total_tokens is None:
            return math.inf
        return limits.max_total_tokens - turn.tokens_in - turn.tokens_out

    @staticmethod
    def _prompt_estimate(messages: list[dict[str, str]], turn: _Turn) -> int:
        """Input tokens of the next call: the last call's prompt plus reply as reported, plus an
        estimate for the tool result appended since."""
        if turn.model_calls == 0:
            return sum(estimate_tokens(m["content"]) for m in messages)
        return turn.last_context + estimate_tokens(messages[-1]["content"])

    def _seed(self, request: NodeRequest, call_index: int) -> int | None:
        if not self.send_seed:
            return None
        return derive_seed("openai", *request.seed_key, call_index) % (2**31)

    @staticmethod
    def _can_step(turn: _Turn, request: NodeRequest) -> bool:
        env = request.environment
        return env is not None and not env.done and turn.env_steps < request.limits.max_env_steps

    def _next_tool(
        self, text: str, tools: tuple[str, ...], turn: _Turn, request: NodeRequest
    ) -> _ToolCall | None:
        """The first tool tag in ``text`` that the node may still use, else (a role acting by
        reply, a reply with no tool tag) the reply's command, or None."""
        for tag in _TOOL_TAG.finditer(text):
            kind = tag.group(1)
            if kind not in tools:
                continue
            if kind == "act" and self._can_step(turn, request):
                return _ToolCall(kind, tag.group(2), tag.end())
            if kind != "act" and turn.tool_calls < request.limits.max_tool_calls:
                return _ToolCall(kind, tag.group(2), tag.end())
            return None
        command = reply_command(text) if acts_by_reply(request) else None
        if command is None or not self._can_step(turn, request):
            return None
        return _ToolCall("act", *command)

    def _run_tool(self, kind: str, body: str, turn: _Turn, request: NodeRequest) -> str:
        if kind == "act":
            return self._act(body.strip(), turn, request)
        turn.tool_calls += 1
        if kind == "python":
            return self._python(body, turn)
        return self._search(body.strip(), turn)

    def _python(self, body: str, turn: _Turn) -> str:
        fenced = _FENCED.match(body)
        code = fenced.group(1) if fenced else body
        run = run_python(code, **self.sandbox.as_kwargs())
        result = format_run(run, RESULT_CHARS)
        turn.tool_uses.append(ToolUse("python", code, result, run.ok))
        turn.evidence.append(Evidence("exec_check", run.ok, f"exit {run.returncode}"))
        return result

    def _search(self, query: str, turn: _Turn) -> str:
        assert self.retriever is not None  # search is offered only with a retriever
        try:
            passages = self.retriever.search(query, 3)
        except RetrieverError as exc:
            turn.tool_failed = True
            result = f"search failed: {exc}"[:RESULT_CHARS]
            turn.tool_uses.append(ToolUse("search", query, result, False))
            return result
        result = format_passages(passages)
        turn.tool_uses.append(ToolUse("search", query, result, bool(passages)))
        ids = ",".join(p.doc_id for p in passages[:3])
        turn.evidence.append(Evidence("retrieval", bool(passages), ids))
        return result

    @staticmethod
    def _act(command: str, turn: _Turn, request: NodeRequest) -> str:
        env = request.environment
        assert env is not None  # <act> is offered only with an environment
        step = env.step(command)
        turn.env_steps += 1
        turn.env_last_ok = step.ok
        turn.tool_uses.append(ToolUse("act", command, step.observation[:RESULT_CHARS], step.ok))
        return step.observation[:RESULT_CHARS]

    @staticmethod
    def _result(
        turn: _Turn, text: str, start: float, status: str, failure: str | None
    ) -> NodeResult:
        return NodeResult(
            text=text,
            answer=None,  # set by run_node from the text, the role and the status
            status=status,
            failure_kind=failure,
            tokens_in=turn.tokens_in,
            tokens_out=turn.tokens_out,
            model_calls=turn.model_calls,
            tool_calls=turn.tool_calls,
            latency_s=time.monotonic() - start,
            tool_uses=tuple(turn.tool_uses),
            evidence=tuple(turn.evidence),
            env_steps=turn.env_steps,
            env_last_ok=turn.env_last_ok,
            usage_estimated=turn.usage_estimated,
        )
