"""A PostgreSQL primary and its streaming standby of a test's own, to fail over (issue 18).

``ReplicatedPostgres`` starts two servers from the embedded wheel's binaries
(``project.embedded``), never the machine's own: a primary on a fresh data folder under
``SCHEDULING_DATA_DIR`` (``.data``), then a standby made from it by ``pg_basebackup -R``
(streaming, hot standby), each on a free TCP port of 127.0.0.1 and no Unix socket. With
``synchronous`` the primary waits for the standby's flush at every commit
(``synchronous_standby_names = '*'``, ``synchronous_commit = on``); without, replication is
asynchronous (PostgreSQL's default).

``url`` is the multi-host URL replicas and workers use: both servers with
``target_session_attrs=read-write``, so libpq connects to whichever accepts writes.
``fail_over()`` stops the primary hard (``pg_ctl stop -m immediate``: no shutdown checkpoint,
sessions cut, as in a crash) and promotes the standby. ``cut_replication()`` stops the standby's
WAL receiver, so what the primary commits afterwards is missing on the standby (asynchronous
replication losing the tail of the primary's WAL, made deterministic). ``reopen_old_primary()``
starts the stopped primary's data folder again on a port of its own (crash recovery replays
what it had committed), so a test can read what the old primary had.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from project import embedded
from tests.acceptance.private_postgres import manage


def free_port() -> int:
    """Return a TCP port of 127.0.0.1 nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    """One server of the pair: its data folder and port."""

    pgdata: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on a connection of its own; return the rows (none if it has none)."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql, params)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        embedded.pg_ctl(self.pgdata, *args, timeout=timeout)

    def start(self, port: int | None = None) -> None:
        """Start the server (on ``port`` instead of its own, when given); wait until it is up."""
        options = f"-p {port}" if port else ""
        self.pg_ctl("-o", options, "-l", str(self.pgdata / "log"), "start")


@dataclass(frozen=True)
class Failover:
    """When a failover happened: wall-clock seconds (``time.time()``) and the database clock."""

    stopped: float  # the primary was stopped (pg_ctl returned)
    promoted: float  # the standby accepts writes (pg_ctl promote -w returned)
    promoted_db: datetime  # the new primary's clock_timestamp() just after


class ReplicatedPostgres:
    """Start a primary and a streaming standby; ``url`` names both (``target_session_attrs``)."""

    def __init__(self, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.folder = (embedded.data_dir() / f"replicated-pg-{uuid.uuid4().hex[:8]}").resolve()
        self.folder.mkdir()
        self.primary = Server(self.folder / "primary", free_port())
        self.standby = Server(self.folder / "standby", free_port())
        self._old_port: int | None = None
        # The wheel makes the folder (initdb, as the user 'pgserver' when root) and starts it on a
        # Unix socket; stopped at once and started again on TCP with replication settings.
        embedded.server(self.primary.pgdata)
        self.primary.pg_ctl("-m", "fast", "stop")
        _configure(self.primary.pgdata, self.primary.port)
        self.primary.start()
        self.standby.pgdata.mkdir(mode=0o700)
        shutil.chown(self.standby.pgdata, *_owner_ids(self.primary.pgdata))
        embedded.program(
            self.primary.pgdata, "pg_basebackup", "-h", "127.0.0.1", "-p",
            str(self.primary.port), "-U", "postgres", "-D", str(self.standby.pgdata), "-R",
            "-X", "stream", "-c", "fast",
        )
        with open(self.standby.pgdata / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"port = {self.standby.port}\n")
        self.standby.start()
        self.wait_streaming()
        if synchronous:
            self.primary.query("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.primary.query("ALTER SYSTEM SET synchronous_commit = 'on'")
            self.primary.query("SELECT pg_reload_conf()")
            self.wait_streaming(state="sync")

    @property
    def url(self) -> str:
        """The multi-host URL of both servers: the one that accepts writes is used."""
        return (
            f"postgresql://postgres@{self.primary.address},{self.standby.address}/postgres"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def wait_streaming(self, state: str = "async", timeout: float = 60) -> None:
        """Wait until the primary streams to the standby in ``state`` (async or sync)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.primary.query("SELECT state, sync_state FROM pg_stat_replication")
            if rows == [("streaming", state)]:
                return
            time.sleep(0.1)
        raise AssertionError(f"standby not streaming ({state}) within {timeout}s: {rows}")

    def wait_replayed(self, timeout: float = 30) -> None:
        """Wait until the standby has replayed everything the primary has written so far."""
        (target,) = self.primary.query("SELECT pg_current_wal_lsn()::text")[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            (done,) = self.standby.query(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]
            )[0]
            if done:
                return
            time.sleep(0.05)
        raise AssertionError(f"standby did not replay up to {target} within {timeout}s")

    def cut_replication(self, timeout: float = 30) -> None:
        """Stop the standby's WAL receiver: later commits of the primary never reach it.

        ``primary_conninfo`` emptied and reloaded (PostgreSQL 13+ applies it without a restart);
        returns once the primary streams to nobody. Only for asynchronous replication: a
        synchronous primary would wait for ever at the next commit.
        """
        assert not self.synchronous, "a synchronous primary would stop committing"
        self.standby.query("ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.query("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while self.primary.query("SELECT count(*) FROM pg_stat_replication")[0][0]:
            if time.monotonic() > deadline:
                raise AssertionError("the standby kept streaming")
            time.sleep(0.05)

    def fail_over(self) -> Failover:
        """Stop the primary hard, then promote the standby; return when each happened."""
        self.primary.pg_ctl("-m", "immediate", "stop")
        stopped = time.time()
        self.standby.pg_ctl("promote", timeout=60)
        promoted = time.time()
        (promoted_db,) = self.standby.query("SELECT clock_timestamp()")[0]
        return Failover(stopped=stopped, promoted=promoted, promoted_db=promoted_db)

    def reopen_old_primary(self) -> Server:
        """Start the stopped primary's data folder on a new port (after ``fail_over``).

        Crash recovery replays its WAL: its tables are what it had committed when it stopped.
        Nothing else knows that port (the replicas' URL names its old one). Returns the server;
        ``close()`` stops it.
        """
        self._old_port = free_port()
        self.primary.start(self._old_port)
        return Server(self.primary.pgdata, self._old_port)

    def manage(self, *args: str, timeout: float = 180, **env: str) -> str:
        """Run ``manage.py`` with DATABASE_URL set to ``url`` (and ``env``); return its output."""
        return manage(self.url, *args, timeout=timeout, **env)

    def close(self) -> None:
        """Stop both servers (whichever still run) and delete their folders."""
        for server in (self.primary, self.standby):
            try:
                server.pg_ctl("-m", "immediate", "stop", timeout=30)
            except subprocess.CalledProcessError:
                pass  # not running
        shutil.rmtree(self.folder, ignore_errors=True)


def _configure(pgdata: Path, port: int) -> None:
    """Listen on 127.0.0.1:``port`` only, stream WAL to a hot standby."""
    with open(pgdata / "postgresql.conf", "a", encoding="utf-8") as conf:
        conf.write(
            "\n# ReplicatedPostgres (tests/acceptance/replicated_postgres.py)\n"
            f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = ''\n"
            "wal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n"
            "wal_receiver_status_interval = 1s\nmax_connections = 100\n"
        )


def _owner_ids(pgdata: Path) -> tuple[int, int]:
    info = pgdata.stat()
    return info.st_uid, info.st_gid
