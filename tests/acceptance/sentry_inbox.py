"""A real local HTTP server that takes Sentry's envelopes, as sentry.io would, and keeps check-ins.

``SentryInbox()`` listens on a free port of 127.0.0.1 in a thread; ``inbox.dsn`` is the DSN to give
the SDK (``SENTRY_DSN``). Each ``POST /api/<project>/envelope/`` body (gzip or brotli when its
``Content-Encoding`` says so) is read as Sentry's envelope format: a JSON header line, then for each
item a JSON item header line and its payload (``length`` bytes when the header gives it, else up to
the next newline). ``inbox.check_ins()`` returns the payloads of the items of type ``check_in``,
``inbox.exceptions(type)`` the messages of the error events' exceptions of that type, in order of
arrival; ``inbox.errors`` what could not be read (a test asserts it empty).
"""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def envelope_items(body: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """Split one envelope into (item header, payload) pairs; ValueError when it is malformed."""
    _, _, rest = body.partition(b"\n")  # the envelope's own header: event id, DSN, sent at
    items = []
    while rest.strip():
        line, _, rest = rest.partition(b"\n")
        header = json.loads(line)
        if "length" in header:
            payload, rest = rest[: header["length"]], rest[header["length"]:]
            rest = rest.removeprefix(b"\n")
        else:
            payload, _, rest = rest.partition(b"\n")
        items.append((header, payload))
    return items


def decoded(body: bytes, encoding: str) -> bytes:
    """``body`` without its ``Content-Encoding`` (gzip, br or none)."""
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "br":
        import brotli  # the SDK compresses with brotli only where it is installed

        return brotli.decompress(body)
    if encoding in ("", "identity"):
        return body
    raise ValueError(f"unknown Content-Encoding {encoding!r}")


class SentryInbox:
    def __init__(self) -> None:
        self.items: list[tuple[dict[str, Any], bytes]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                inbox.receive(self.path, self.headers.get("Content-Encoding", ""), body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.dsn = f"http://public@127.0.0.1:{self.server.server_address[1]}/1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def receive(self, path: str, encoding: str, body: bytes) -> None:
        """Keep the items of one request; a request that cannot be read is kept in ``errors``."""
        try:
            if path.split("?")[0] != "/api/1/envelope/":
                raise ValueError(f"POST to {path}")
            items = envelope_items(decoded(body, encoding))
        except (ValueError, ImportError, OSError) as exc:
            with self._lock:
                self.errors.append(f"{path}: {exc!r}")
            return
        with self._lock:
            self.items.extend(items)

    def payloads(self, kind: str) -> list[dict[str, Any]]:
        """The JSON payloads of the items of type ``kind`` received so far, in order of arrival."""
        with self._lock:
            return [json.loads(p) for header, p in self.items if header.get("type") == kind]

    def check_ins(self) -> list[dict[str, Any]]:
        """The check-ins received so far, in order of arrival."""
        return self.payloads("check_in")

    def exceptions(self, kind: str) -> list[str]:
        """The messages of the exceptions of type ``kind`` in the error events received so far."""
        return [
            value["value"]
            for event in self.payloads("event")
            for value in event.get("exception", {}).get("values", [])
            if value["type"] == kind
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
