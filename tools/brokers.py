"""Broker faults for the chaos tool: messages purged, connections cut, the database flushed.

``Broker(url, queue)`` is the broker the chaos run's children use (their ``CELERY_BROKER_URL``)
and the run's own queue. ``kinds`` lists the faults it can take, each only where it touches
nothing but the chaos run:

- ``purge``: the run's queue emptied (kombu's ``queue_purge``: the messages waiting in it are
  lost; on the serviceless SQL broker the delivered, unacknowledged ones too). Every transport.
- ``cut``: the broker connections of one child process cut. Redis: ``CLIENT KILL ADDR`` of each
  TCP connection the victim's process group holds to the Redis server (found in ``/proc``; Linux
  only). The serviceless SQL broker (``project.broker``): ``pg_terminate_backend`` of the
  victim's broker sessions, named ``kombu-sqlpoll:<pid>``. RabbitMQ: ``rabbitmqctl
  close_all_connections`` on the URL's vhost, every connection at once, and only when the caller
  says the vhost is the run's own (``own_vhost``) and it is not ``/``.
- ``flush``: Redis only, ``FLUSHDB`` of the database the URL names, and only when the URL names
  one (``redis://host:6379/8``): a URL without a database number means DB 0, which the tool never
  flushes unless the URL says ``/0``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: ``application_name`` prefix of the serviceless SQL broker's sessions (``project.broker``).
SQL_BROKER_APPLICATION = "kombu-sqlpoll"


def transport_of(url: str) -> str:
    """``redis``, ``amqp``, ``sql`` or the URL's scheme, from a broker URL."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("redis", "rediss"):
        return "redis"
    if scheme in ("amqp", "amqps", "pyamqp"):
        return "amqp"
    if scheme.startswith(("sqlpoll+", "sqla+", "sqlalchemy+")):
        return "sql"
    return scheme


def redis_db(url: str) -> int | None:
    """The database number a Redis URL names (path ``/8`` or query ``db=8``), else None."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    if path.isdigit():
        return int(path)
    db = parse_qs(parts.query).get("db", [""])[0]
    return int(db) if db.isdigit() else None


def amqp_vhost(url: str) -> str:
    """The vhost of an AMQP URL (``amqp://h:5672//`` and ``amqp://h:5672`` are ``/``)."""
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


class Broker:
    """The chaos run's broker and the faults it can take (``kinds``); see the module docstring."""

    def __init__(
        self, url: str, queue: str, *, transport_options: dict[str, Any] | None = None,
        own_vhost: bool = False,
    ) -> None:
        self.url = url
        self.queue = queue
        self.transport = transport_of(url)
        self.transport_options = dict(transport_options or {})
        self.own_vhost = own_vhost

    @property
    def kinds(self) -> list[str]:
        kinds = ["purge"]
        cuttable = {
            "redis": Path("/proc/net/tcp").exists(),
            "sql": True,
            "amqp": self.own_vhost and amqp_vhost(self.url) != "/"
            and shutil.which("rabbitmqctl") is not None,
        }
        if cuttable.get(self.transport):
            kinds.append("cut")
        if self.transport == "redis" and redis_db(self.url) is not None:
            kinds.append("flush")
        return kinds

    @property
    def cuts_all(self) -> bool:
        """Whether a cut closes every connection at once (RabbitMQ) rather than a victim's."""
        return self.transport == "amqp"

    def purge(self) -> int:
        """Empty the run's queue; return how many messages were removed.

        On the SQL broker the messages are deleted with SKIP LOCKED: a row a worker's open
        transaction holds (a worker this run SIGSTOPped while it took a message holds it until
        the SIGCONT that the fault loop would never reach while a purge waited) stays, as a
        message already on its way to that worker would on the other brokers.
        """
        if self.transport == "sql":
            return self._purge_sql()
        from kombu import Connection

        with (
            Connection(self.url, transport_options=self.transport_options) as connection,
            connection.channel() as channel,
        ):
            return int(channel.queue_purge(self.queue) or 0)

    def cut(self, pids: set[int]) -> int:
        """Cut the broker connections of the processes ``pids``; return how many were cut."""
        if self.transport == "redis":
            return self._cut_redis(pids)
        if self.transport == "sql":
            return self._cut_sql(pids)
        if self.transport == "amqp":
            return self._cut_amqp()
        return 0

    def flush(self) -> int:
        """FLUSHDB the database the Redis URL names; return how many keys it held."""
        if self.transport != "redis" or redis_db(self.url) is None:
            raise ValueError(f"not a Redis URL naming its database: {self.url}")
        client = self._redis()
        try:
            keys = int(client.dbsize())
            client.flushdb()
        finally:
            client.close()
        return keys

    def locate(self, task_ids: list[str]) -> tuple[str, dict[str, str]]:
        """Where the broker holds the messages of ``task_ids``: a summary line and, per task id,
        a description (Redis: in the queue, in kombu's ``unacked`` hash, or nowhere; the SQL
        broker: its rows and their state). Empty for brokers that cannot be looked into."""
        if self.transport == "redis":
            return self._locate_redis(task_ids)
        if self.transport == "sql":
            return self._locate_sql(task_ids)
        return "", {}

    def _locate_redis(self, task_ids: list[str]) -> tuple[str, dict[str, str]]:
        client = self._redis()
        try:
            queued = b"".join(client.lrange(self.queue, 0, -1))
            unacked = client.hgetall("unacked")
            since = dict(client.zrange("unacked_index", 0, -1, withscores=True))
            mutex = client.pttl("unacked_mutex")
        finally:
            client.close()
        found = {}
        for task_id in task_ids:
            key = task_id.encode()
            where = ["in the queue"] if key in queued else []
            where += [f"unacked {tag.decode()} since {since.get(tag)}"
                      for tag, raw in unacked.items() if key in raw]
            found[task_id] = ", ".join(where) or "nowhere (not queued, not unacked)"
        return f"broker: {len(unacked)} unacked, unacked_mutex pttl {mutex} ms", found

    def _locate_sql(self, task_ids: list[str]) -> tuple[str, dict[str, str]]:
        import psycopg

        found = {}
        with psycopg.connect(_libpq_url(self.url), autocommit=True) as connection:
            for task_id in task_ids:
                rows = connection.execute(
                    "SELECT m.id, m.visible, m.timestamp FROM kombu_message m"
                    " JOIN kombu_queue q ON q.id = m.queue_id"
                    " WHERE q.name = %s AND strpos(m.payload, %s) > 0 ORDER BY m.id",
                    [self.queue, task_id],
                ).fetchall()
                found[task_id] = "; ".join(
                    f"row {pk} " + ("waiting" if visible else
                                    f"delivered at {at}, unacked" if at else "acknowledged")
                    for pk, visible, at in rows
                ) or "nowhere (no row)"
        return "", found

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)

    def _cut_redis(self, pids: set[int]) -> int:
        parts = urlsplit(self.url)
        ends = connections_to(pids, parts.port or 6379)
        if not ends:
            return 0
        client = self._redis()
        try:
            cut = 0
            for host, port in ends:
                with contextlib.suppress(redis_errors()):  # closed meanwhile: nothing to cut
                    cut += int(client.execute_command("CLIENT", "KILL", "ADDR", f"{host}:{port}"))
            return cut
        finally:
            client.close()

    def _purge_sql(self) -> int:
        import psycopg

        with psycopg.connect(_libpq_url(self.url), autocommit=True) as connection:
            row = connection.execute(
                "WITH gone AS (DELETE FROM kombu_message WHERE id IN ("
                " SELECT m.id FROM kombu_message m JOIN kombu_queue q ON q.id = m.queue_id"
                " WHERE q.name = %s FOR UPDATE OF m SKIP LOCKED) RETURNING 1)"
                " SELECT count(*) FROM gone",
                [self.queue],
            ).fetchone()
        return int(row[0]) if row else 0

    def _cut_sql(self, pids: set[int]) -> int:
        import psycopg

        names = [f"{SQL_BROKER_APPLICATION}:{pid}" for pid in sorted(pids)]
        with psycopg.connect(_libpq_url(self.url), autocommit=True) as connection:
            row = connection.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = ANY(%s) AND pid <> pg_backend_pid()",
                [names],
            ).fetchone()
        return int(row[0]) if row else 0

    def _cut_amqp(self) -> int:
        vhost = amqp_vhost(self.url)
        done = subprocess.run(
            ["rabbitmqctl", "close_all_connections", "-p", vhost, "chaos: connection cut"],
            capture_output=True, text=True, timeout=30, check=False,
        )
        return 1 if done.returncode == 0 else 0


def redis_errors() -> type[Exception]:
    import redis

    return redis.RedisError


def _libpq_url(url: str) -> str:
    """``sqlpoll+postgresql+psycopg://...`` (a SQLAlchemy URL) as a libpq URL."""
    scheme, rest = url.split("://", 1)
    return f"postgresql://{rest}" if "postgresql" in scheme else url


def process_group(pgid: int) -> set[int]:
    """The ids of the live processes in process group ``pgid`` (from ``/proc``)."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:  # after "(comm)": state, ppid, pgrp
            pids.add(int(stat.parent.name))
    return pids


def connections_to(pids: set[int], port: int) -> list[tuple[str, int]]:
    """The local (address, port) of every TCP connection ``pids`` hold to remote ``port``."""
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ends = []
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port:
                host, local_port = local.rsplit(":", 1)
                ends.append((_address(host, family), int(local_port, 16)))
    return ends


def _address(hex_host: str, family: int) -> str:
    raw = bytes.fromhex(hex_host)
    if family == 4:
        return ".".join(str(b) for b in reversed(raw))
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # four little-endian 32-bit words
    import ipaddress

    address = ipaddress.IPv6Address(b"".join(words))
    return str(address.ipv4_mapped or address)
