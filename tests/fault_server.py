"""A fault-injecting OpenAI-compatible chat-completions server on 127.0.0.1, for tests.

Each POST is answered by the next fault of a script (the last one repeats): a normal reply
(``ok``) or one of :data:`FAULTS`. The server is bounded: it stops itself ``deadline_s``
after it starts or once it has answered ``max_requests`` requests (later connections are
refused), and ``close`` releases hanging and dripping handlers and joins every thread. Every
request is logged with its headers and JSON body (:attr:`FaultServer.log`).

    with FaultServer(["http_500", "ok"]) as srv:
        ex = OpenAIExecutor(srv.base_url, "m", backoff_s=0)
        ...
        assert len(srv.log) == 2
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from json_server import LocalServer

FAULTS = (
    "http_500",  # 500 with a JSON error body
    "http_401",  # 401, as a server that wants an API key answers
    "hang",  # reads the request and never answers until the server stops
    "drip",  # a valid reply, one byte every drip_s seconds (status line included)
    "cut_off",  # Content-Length of the full reply, half of it sent, connection closed
    "malformed_json",  # 200 with a body that is not JSON
    "empty_choices",  # "choices": []
    "content_parts",  # content as a list of {"type": "text"} parts
    "content_int",  # content is 42
    "usage_not_int",  # prompt_tokens "many"
    "usage_negative",  # prompt_tokens -100000
)
"""The faults besides ``ok``; the comments say what each sends."""

NEGATIVE_PROMPT_TOKENS = -100_000


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server read it."""

    path: str
    headers: dict[str, str]
    body: object

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (case-insensitive), or None."""
        found = [v for k, v in self.headers.items() if k.lower() == name.lower()]
        return found[0] if found else None


def completion(content: object, usage: dict[str, object] | None) -> dict:
    """A chat-completions body with one choice."""
    body: dict = {
        "id": "fault-server",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return body


class FaultServer(LocalServer):
    """Answers ``/v1/chat/completions`` (any path, in fact) with scripted faults."""

    def __init__(
        self,
        faults: str | Sequence[str] = "ok",
        *,
        text: str = "The answer is \\boxed{42}.",
        usage: tuple[int, int] = (10, 5),
        drip_s: float = 0.3,
        deadline_s: float = 30.0,
        max_requests: int = 200,
    ) -> None:
        script = (faults,) if isinstance(faults, str) else tuple(faults)
        unknown = [f for f in script if f != "ok" and f not in FAULTS]
        if not script or unknown:
            raise ValueError(f"fault server: unknown faults {unknown} (known: ok, {FAULTS})")
        self.script = script
        self.text = text
        self.usage = usage
        self.drip_s = drip_s
        self.deadline_s = deadline_s
        self.max_requests = max_requests
        self.log: list[LoggedRequest] = []
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._stop_at_deadline, daemon=True)
        super().__init__(self._handler())
        self.base_url = f"{self.root}/v1"

    def __enter__(self) -> FaultServer:
        super().__enter__()
        self._watchdog.start()
        return self

    # --- bounds ---------------------------------------------------------------------
    def _stop_at_deadline(self) -> None:
        self._stop.wait(self.deadline_s)
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()  # later connections are refused

    def _stopping(self) -> None:
        self._stop.set()
        if self._watchdog.is_alive():
            self._watchdog.join()

    @property
    def stopped(self) -> bool:
        """Whether the server stopped (closed, past its deadline or its request limit)."""
        return self._stop.is_set()

    # --- answers --------------------------------------------------------------------
    def _next_fault(self, request: LoggedRequest) -> str:
        with self._lock:
            self.log.append(request)
            n = len(self.log)
        if n >= self.max_requests:
            self._stop.set()  # answer this one, then stop
        return self.script[min(n, len(self.script)) - 1]

    def reply_for(self, fault: str) -> tuple[int, bytes]:
        """(status, body) of a fault that sends a whole response."""
        prompt, completion_tokens = self.usage
        usage: dict[str, object] = {"prompt_tokens": prompt, "completion_tokens": completion_tokens}
        content: object = self.text
        if fault == "http_500":
            return 500, b'{"error": {"message": "internal error (injected)"}}'
        if fault == "http_401":
            return 401, b'{"error": {"message": "missing or invalid API key (injected)"}}'
        if fault == "malformed_json":
            return 200, b'{"choices": [{"message": {"content": "The ans'
        if fault == "empty_choices":
            return 200, json.dumps({"choices": [], "usage": usage}).encode()
        if fault == "content_parts":
            half = len(self.text) // 2
            content = [
                {"type": "text", "text": self.text[:half]},
                {"type": "text", "text": self.text[half:]},
            ]
        elif fault == "content_int":
            content = 42
        elif fault == "usage_not_int":
            usage["prompt_tokens"] = "many"
        elif fault == "usage_negative":
            usage["prompt_tokens"] = NEGATIVE_PROMPT_TOKENS
        return 200, json.dumps(completion(content, usage)).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body: object = json.loads(raw)
                except ValueError:
                    body = raw
                fault = server._next_fault(LoggedRequest(self.path, dict(self.headers), body))
                if fault == "hang":
                    server._stop.wait()
                    return
                status, payload = server.reply_for("ok" if fault in ("drip", "cut_off") else fault)
                head = (
                    f"HTTP/1.0 {status} {self.responses[status][0]}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n"
                ).encode()
                message = head + payload
                if fault == "cut_off":
                    message = message[: len(head) + len(payload) // 2]
                try:
                    if fault != "drip":
                        self.wfile.write(message)
                        return
                    for i in range(len(message)):
                        if server._stop.wait(server.drip_s):
                            return
                        self.wfile.write(message[i : i + 1])
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its deadline): what a real server sees too

            def log_message(self, *args: object) -> None:
                pass

        return Handler
