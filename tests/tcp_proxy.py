"""A small TCP proxy for outage tests: put it between beat replicas and a broker, then cut it.

``TcpProxy(upstream)`` listens on 127.0.0.1 (an ephemeral port, ``proxy.port``) and forwards each
connection to ``upstream``: a ``(host, port)`` pair or the path of a Unix socket (the embedded
PostgreSQL listens on one only). ``cut()`` closes every open connection and stops listening, so
new connections are refused, until ``restore()`` listens again on the same port. ``freeze()``
keeps connections open and accepts new ones but forwards nothing (a frozen broker host) until
``thaw()``. Threads, one pair per connection; ``close()`` ends everything.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import parse_qs, urlsplit, urlunsplit


class TcpProxy:
    """Forward 127.0.0.1:``port`` to ``upstream``; cut, restore, freeze and thaw on demand."""

    def __init__(self, upstream: tuple[str, int] | str) -> None:
        self.upstream = upstream
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # the listener was closed: cut() or close()
                return
            try:
                server = self._connect_upstream()
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, server))
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.settimeout(5)
        server.connect(self.upstream)
        server.settimeout(None)
        return server

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                target.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(source, target)

    def _drop(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with self._lock:
                self._open.discard(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    @property
    def connections(self) -> int:
        """Number of proxied connections open now (each counts its two sockets once)."""
        with self._lock:
            return len(self._open) // 2

    def cut(self) -> None:
        """Close every proxied connection and refuse new ones until ``restore()``."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:  # close() alone does not wake a thread blocked in accept(): the port would
                listener.shutdown(socket.SHUT_RDWR)  # go on accepting
            except OSError:
                pass
            listener.close()
        with self._lock:
            sockets = list(self._open)
        self._drop(*sockets)
        self._flowing.set()

    def restore(self) -> None:
        """Listen again on the same port after ``cut()``."""
        if self._listener is None:
            self._listen()

    def freeze(self) -> None:
        """Stop forwarding bytes (connections stay open, new ones are accepted)."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Forward again after ``freeze()``."""
        self._flowing.set()

    def close(self) -> None:
        """Stop listening and close every connection."""
        self.cut()


def proxied_broker_url(url: str) -> tuple[str, tuple[str, int] | str]:
    """Return ``(url with a placeholder host, upstream)`` for a Redis or SQL-transport broker URL.

    The placeholder ``127.0.0.1:{port}`` is filled with ``url.format(port=proxy.port)``. For a
    PostgreSQL URL whose host is a Unix socket folder (``?host=/path``, the embedded server), the
    upstream is the socket file ``/path/.s.PGSQL.<port>`` and the query is dropped.
    """
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = (f"{auth}@" if auth else "") + "127.0.0.1:{port}"
    socket_dir = parse_qs(parts.query).get("host", [""])[0]
    if socket_dir.startswith("/"):
        upstream: tuple[str, int] | str = f"{socket_dir}/.s.PGSQL.{parts.port or 5432}"
        query = ""
    else:
        upstream = (parts.hostname or "127.0.0.1", parts.port or _DEFAULT_PORTS[parts.scheme])
        query = parts.query
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)), upstream


_DEFAULT_PORTS = {"redis": 6379, "sqlpoll+postgresql+psycopg": 5432, "amqp": 5672}
