"""A real local HTTP server for the webhook tests: http.server on a free port of 127.0.0.1.

``Hook()`` starts it in a thread; ``hook.url`` is where to POST; ``hook.documents`` the JSON bodies
received, in order; ``hook.answers`` the statuses to answer with, one per request (then 200), and
``hook.delay`` seconds to wait before answering (a slow server). ``hook.close()`` stops it.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hook:
    def __init__(self, answers: list[int] | None = None, delay: float = 0.0) -> None:
        self.documents: list[dict[str, Any]] = []
        self.requests = 0
        self.answers = list(answers or [])
        self.delay = delay
        self.content_types: list[str] = []
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook._lock:
                    hook.requests += 1
                    status = hook.answers.pop(0) if hook.answers else 200
                    if status == 200:
                        hook.documents.append(json.loads(body))
                        hook.content_types.append(self.headers.get("Content-Type", ""))
                if hook.delay:
                    time.sleep(hook.delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the client gave up (its timeout)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def events(self, kind: str) -> list[dict[str, Any]]:
        """The documents received whose ``event`` is ``kind``."""
        with self._lock:
            return [doc for doc in self.documents if doc.get("event") == kind]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
