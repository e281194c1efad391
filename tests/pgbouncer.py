"""A real PgBouncer of the tests' own, in transaction mode, in front of the test PostgreSQL.

``PgBouncer(upstream)`` writes an ini file and a user list into a fresh folder, starts Debian's
``pgbouncer`` binary in the foreground on a free port of 127.0.0.1 (never a system-wide
instance: its own config, port, log and pid file), and waits until it accepts connections.
``upstream`` is ``(host, port)``, or the folder of a Unix socket with its port (the embedded
PostgreSQL listens on a socket only). Every database name is forwarded (``* =``), with
``auth_type = trust``: the server's own authentication applies. ``stop()`` ends it.

PgBouncer refuses to run as root: as root it is started with ``-u`` as the owner of the upstream
socket folder, else ``postgres``, else ``nobody``.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARY_PLACES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((place for place in BINARY_PLACES if os.access(place, os.X_OK)), None)


def version(executable: str) -> tuple[int, int]:
    """(major, minor) of ``pgbouncer --version`` ("PgBouncer 1.18.0")."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"PgBouncer (\d+)\.(\d+)", out.stdout)
    assert match, out.stdout
    return int(match[1]), int(match[2])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """One pgbouncer process in transaction mode; ``port`` is where it listens on 127.0.0.1."""

    def __init__(
        self, upstream: tuple[str, int], *, pool_size: int = 20, executable: str | None = None
    ) -> None:
        self.executable = executable or binary() or "pgbouncer"
        self.version = version(self.executable)
        self.upstream = upstream
        self.pool_size = pool_size
        self.folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.log = self.folder / "pgbouncer.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._user = _run_as(upstream[0]) if os.geteuid() == 0 else None
        for attempt in range(5):  # a free port may be taken between the look and the bind
            try:
                self._start()
                return
            except RuntimeError:
                if attempt == 4:
                    raise

    @property
    def keeps_prepared(self) -> bool:
        """Whether this PgBouncer keeps protocol-level prepared statements (1.21 and later)."""
        return self.version >= (1, 21)

    def _config(self) -> str:
        host, port = self.upstream
        lines = [
            "[databases]",
            f"* = host={host} port={port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.folder / 'userlist.txt'}",
            "pool_mode = transaction",
            "max_client_conn = 500",
            f"default_pool_size = {self.pool_size}",
            f"logfile = {self.log}",
            f"pidfile = {self.folder / 'pgbouncer.pid'}",
            "ignore_startup_parameters = extra_float_digits",
        ]
        if self.keeps_prepared:
            lines.append("max_prepared_statements = 100")
        return "\n".join(lines) + "\n"

    def _start(self) -> None:
        self.port = free_port()
        ini = self.folder / "pgbouncer.ini"
        ini.write_text(self._config())
        (self.folder / "userlist.txt").write_text('"postgres" ""\n')
        command = [self.executable, str(ini)]
        if self._user is not None:
            command[1:1] = ["-u", self._user]
            uid = pwd.getpwnam(self._user).pw_uid
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, uid, -1)
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start:\n{self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen within 30 s:\n{self.tail()}")

    def url(self, database: str, user: str = "postgres") -> str:
        """A libpq URL of ``database`` through this PgBouncer."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop pgbouncer (SIGTERM, then SIGKILL) and remove its folder."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _run_as(host: str) -> str:
    """The user pgbouncer runs as when started by root (see the module docstring)."""
    if host.startswith("/"):
        owner = pwd.getpwuid(Path(host).stat().st_uid).pw_name
        if owner != "root":
            return owner
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("no user to run pgbouncer as (it refuses root)")
