"""The learner's small HTTP server: ``GET /status`` (JSON), ``/healthz`` and ``/metrics`` (Prometheus).

It runs in a daemon thread and only reads a snapshot the training loop replaces under a lock, so it
never touches the Kafka consumer or the model (neither is thread-safe).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


class StatusBoard:
    """The latest status snapshot, shared between the loop (writer) and the server (reader)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] = {"state": "starting"}

    def update(self, **fields: Any) -> None:
        """Replace some fields of the snapshot."""
        with self._lock:
            self._snapshot = {**self._snapshot, **fields}

    def snapshot(self) -> dict[str, Any]:
        """A copy of the snapshot."""
        with self._lock:
            return dict(self._snapshot)


class StatusServer:
    """Serves a :class:`StatusBoard` on ``host:port`` (port 0 picks a free one; see :attr:`port`)."""

    def __init__(self, board: StatusBoard, host: str, port: int) -> None:
        board_ref = board

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/status":
                    self._send(200, "application/json", json.dumps(board_ref.snapshot(), sort_keys=True).encode())
                elif path == "/healthz":
                    healthy = board_ref.snapshot().get("state") != "failed"
                    self._send(200 if healthy else 503, "text/plain", b"ok\n" if healthy else b"failed\n")
                elif path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest())
                else:
                    self._send(404, "text/plain", b"not found: try /status, /healthz or /metrics\n")

            def _send(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: scraped every few seconds
                return

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="learner-status", daemon=True)

    def start(self) -> None:
        """Serve in a daemon thread."""
        self.thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
