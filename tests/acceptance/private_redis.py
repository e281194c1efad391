"""A Redis server of a test's own, for faults that must touch nothing but that test.

The machine's Redis is shared by every test the suite runs beside (``.ci/run`` runs two test
files at a time on its database 0): a ``FLUSHDB`` there empties other deployments' queues and
RedBeat's schedule under them (seen in CI: a RedBeat baseline sent 7 of 15 runs while the chaos
test flushed the database). ``private_redis`` starts Debian's ``redis-server`` on a free port,
without persistence, and stops it at the end whatever happens.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.acceptance.deployment import wait_until

MISSING = "redis-server is missing (apt-get install -y redis-server)"


def free_port(address: str) -> int:
    """A TCP port nothing listens on at ``address`` now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def private_redis(folder: Path, address: str = "127.0.0.1") -> Iterator[str]:
    """Run ``redis-server`` on ``address`` and a free port, its files in ``folder``; yield its URL
    (``redis://address:port/0``) once it answers PING (30 s at most).

    Raises ``FileNotFoundError`` when no ``redis-server`` is installed (``.ci/run`` installs it).
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError(MISSING)
    port = free_port(address)
    process = subprocess.Popen(
        [binary, "--bind", address, "--port", str(port), "--save", "", "--appendonly", "no",
         "--protected-mode", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _answers(address, port), timeout=30)
        yield f"redis://{address}:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False
