"""A PostgreSQL server of a test's own, which the test may stop and start (a database outage).

The machine's PostgreSQL, and the embedded server the rest of the suite shares, must never be
stopped; ``PrivatePostgres`` runs the embedded wheel's binaries (``project.embedded``) on a
fresh data folder under ``SCHEDULING_DATA_DIR`` (``.data``), listening on a Unix socket only,
whatever DATABASE_URL says.
``stop()`` is pg_ctl's fast shutdown (open sessions are ended, as in a restart), ``start()``
brings the same server back on the same socket; ``close()`` stops it and deletes the folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg

from project import embedded

ROOT = Path(__file__).resolve().parents[2]


class PrivatePostgres:
    """Start a PostgreSQL server on a new data folder; ``url`` is its ``postgres`` database.

    With ``listen=(address, port)`` it listens there on TCP too (trusting every client: it is a
    test's own) and ``url`` names that address, as a partition test needs (``tests.netns``).
    """

    def __init__(self, listen: tuple[str, int] | None = None) -> None:
        self.pgdata = (embedded.data_dir() / f"private-pg-{uuid.uuid4().hex[:8]}").resolve()
        server = embedded.server(self.pgdata)  # initdb, then start
        self._socket_dir = server.get_postmaster_info().socket_dir
        self.url = server.get_uri()
        self._listen = listen
        if listen is not None:
            with open(self.pgdata / "pg_hba.conf", "a") as hba:
                hba.write("host all all 0.0.0.0/0 trust\n")
            self.stop()
            self.start()
            self.url = f"postgresql://postgres@{listen[0]}:{listen[1]}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        embedded.pg_ctl(self.pgdata, *args, timeout=30)

    def stop(self) -> None:
        """Fast shutdown: sessions are rolled back and closed, new connections refused."""
        self._pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        """Start the server again on the same socket; returns once it accepts connections."""
        host = f"-h {self._listen[0]} -p {self._listen[1]}" if self._listen else '-h ""'
        self._pg_ctl(
            "-o", host, "-o", f"-k {self._socket_dir}", "-l", str(self.pgdata / "log"), "start"
        )

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on a connection of its own; return the rows."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def manage(self, *args: str, timeout: float = 120) -> str:
        """Run ``manage.py`` with DATABASE_URL on this server; return its output."""
        return manage(self.url, *args, timeout=timeout)

    def close(self) -> None:
        """Stop the server (if running) and delete its data folder."""
        try:
            self._pg_ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.pgdata, ignore_errors=True)



def manage(database_url: str, *args: str, timeout: float = 120, **env: str) -> str:
    """Run ``manage.py ARGS`` with ``DATABASE_URL`` (and ``env``); return its output.

    Raises AssertionError with its stderr when it fails.
    """
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "DATABASE_URL": database_url, **env}, timeout=timeout, check=False,
    )
    if done.returncode:
        raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout
