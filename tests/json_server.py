"""HTTP servers on a free 127.0.0.1 port, for tests of HTTP clients.

:class:`LocalServer` serves a request handler class from a thread until ``close``;
:class:`JSONServer` answers JSON POSTs through a ``respond(path, body, headers) -> (status,
reply)`` function (``reply`` bytes as they are, anything else as JSON). The fault-injecting
chat-completions server (``fault_server.py``) is a :class:`LocalServer` too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Responder = Callable[[str, dict, dict[str, str]], tuple[int, object]]


class LocalServer:
    """Serves ``handler`` at ``root`` (``http://127.0.0.1:PORT``) from the time it is entered
    until ``close``; ``close`` joins the serving thread and every handler thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = False  # server_close() joins the handler threads
        self.port = self._server.server_address[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    def __enter__(self) -> LocalServer:
        self._thread.start()
        self._started = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and free the port (idempotent, from any thread but a handler's)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stopping()
        if self._started:
            self._server.shutdown()
        self._server.server_close()
        if self._started:
            self._thread.join()

    def _stopping(self) -> None:
        """Hook run first by ``close``: release handlers that wait (none here)."""


class JSONServer(LocalServer):
    """Runs ``respond`` behind ``root`` until ``close``."""

    def __init__(self, respond: Responder) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, reply = respond(self.path, body, dict(self.headers))
                payload = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)

    def __enter__(self) -> JSONServer:
        super().__enter__()
        return self
