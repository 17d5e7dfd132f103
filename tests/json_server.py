"""A JSON-over-HTTP server on a free 127.0.0.1 port, for tests of HTTP clients.

The test gives a ``respond(path, body, headers) -> (status, reply)`` function; every POST is
decoded from JSON and answered with ``reply`` (bytes as they are, anything else as JSON).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Responder = Callable[[str, dict, dict[str, str]], tuple[int, object]]


class JSONServer:
    """Runs ``respond`` behind ``root`` (``http://127.0.0.1:PORT``) until ``close``."""

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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._closed = False

    def __enter__(self) -> JSONServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
