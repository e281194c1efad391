"""Where the benchmark runs: a database of its own on the configured server, and the broker.

``bench_database()`` creates a fresh database ``bench_<pid>`` on the server that DATABASE_URL
names (the embedded server when it is unset), points DATABASE_URL at it for this process and the
beat processes it starts, migrates it, and drops it at the end (``DROP DATABASE ... WITH
(FORCE)``). With CELERY_BROKER_URL unset the broker is kombu's SQL transport on that database, so
dropping it removes the broker's tables too; on Redis each scenario uses queues of its own, which
``Broker.delete`` removes.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql


def _server_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    from project import embedded

    return embedded.embedded_database_url()


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _admin_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def bench_database() -> Iterator[str]:
    """Create, migrate and finally drop the benchmark's own database; yield its URL.

    Sets DATABASE_URL (inherited by the beat processes) and calls ``django.setup()``.
    """
    server = _server_url()
    name = f"bench_{os.getpid()}"
    with psycopg.connect(_admin_dsn(server), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = _with_database(server, name)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    try:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        yield url
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(_admin_dsn(server), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


class Broker:
    """The configured broker (settings.CELERY_BROKER_URL), seen from the benchmark process."""

    def __init__(self) -> None:
        from django.conf import settings
        from kombu import Connection

        self.url: str = settings.CELERY_BROKER_URL
        self.connection = Connection(self.url)
        self.channel = self.connection.default_channel

    @property
    def kind(self) -> str:
        """``redis``, ``sql`` (kombu's SQL transport) or the URL's scheme."""
        scheme = self.url.split(":", 1)[0]
        if scheme.startswith("sqlpoll") or scheme.startswith("sqla"):
            return "sql"
        return scheme

    def count(self, queue: str) -> int:
        """Messages waiting in ``queue`` (0 for a queue not declared yet)."""
        return self.channel.queue_declare(queue=queue, durable=True, auto_delete=False)[1]

    def wait_count(self, queue: str, expected: int, timeout: float) -> float | None:
        """Wait until ``queue`` holds ``expected`` messages; return time.time() then, or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count(queue) >= expected:
                return time.time()
            time.sleep(0.05)
        return None

    def delete(self, queue: str) -> None:
        """Drop every message of ``queue``, the queue itself and, on Redis, its bindings.

        Celery binds each queue to a direct exchange of the same name; kombu keeps that binding
        in ``_kombu.binding.<exchange>`` keys, which deleting the queue from another channel
        leaves behind.
        """
        self.channel.queue_purge(queue)
        self.channel.queue_delete(queue)
        if self.kind == "redis":
            client = self.channel.client
            for key in (f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"):
                client.delete(key)

    def close(self) -> None:
        self.connection.release()

    def describe(self) -> str:
        """The broker's kind and version, without credentials."""
        if self.kind == "redis":
            info = self.channel.client.info("server")
            return f"Redis {info.get('redis_version')} ({urlsplit(self.url).hostname})"
        if self.kind == "sql":
            return "kombu SQL transport on the same PostgreSQL (the embedded default)"
        return self.kind


class Arrivals:
    """When each message reached the broker, by Celery task id (epoch seconds, all copies).

    A thread watches the queue as messages arrive: on Redis it pops them (BRPOP for the first,
    then RPOP of all that are there, so the harness costs the machine one round trip per batch,
    not per message; a time is at most one pass of that loop after the arrival), on kombu's SQL
    transport it reads the new message rows every 20 ms (the table keeps no insert time), so the
    time is the arrival at the broker to within one poll. Other brokers: none (the cross-check is
    then left out).

    ``relay`` (Redis only): a queue the popped messages are pushed on to, unchanged and in their
    order, for workers consuming it (``bench.herd``): the arrival is timed and the runs still
    execute.
    """

    def __init__(self, broker: Broker, queue: str, relay: str | None = None) -> None:
        self.broker, self.queue, self.relay = broker, queue, relay
        self.times: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Arrivals:
        target = {"redis": self._pop, "sql": self._read}.get(self.broker.kind)
        if target is not None:
            self.broker.count(self.queue)  # declare it, so the SQL transport has its row
            self._thread = threading.Thread(target=target, daemon=True)
            self._thread.start()
        return self

    def _seen(self, payload: str | bytes, at: float) -> None:
        task_id = json.loads(payload)["headers"]["id"]
        self.times.setdefault(task_id, []).append(at)

    def _pop(self) -> None:
        import redis

        client = redis.Redis.from_url(self.broker.url)
        while not self._stop.is_set():
            item = client.brpop([self.queue], timeout=0.2)
            if item is None:
                continue
            at = time.time()
            payloads = [item[1], *(client.rpop(self.queue, 1000) or [])]  # what else is there
            for payload in payloads:
                self._seen(payload, at)
            if self.relay is not None:
                client.lpush(self.relay, *payloads)

    def _read(self) -> None:
        dsn = self.broker.url.split("+", 1)[1].replace("postgresql+psycopg://", "postgresql://")
        last = 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT m.id, m.payload FROM kombu_message m"
                    " JOIN kombu_queue q ON q.id = m.queue_id"
                    " WHERE q.name = %s AND m.id > %s ORDER BY m.id",
                    [self.queue, last],
                ).fetchall()
                now = time.time()
                for message_id, payload in rows:
                    self._seen(payload, now)
                    last = max(last, message_id)
                time.sleep(0.02)

    def stop(self) -> dict[str, list[float]] | None:
        """Return every arrival by task id, or None when the broker cannot tell."""
        if self._thread is None:
            return None
        time.sleep(0.5)
        self._stop.set()
        self._thread.join()
        return self.times


def machine() -> dict[str, str]:
    """Cores, RAM, CPU model, load average, OS and Python of this machine."""
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "unknown"
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        ram = f"{pages * size / 2**30:.1f} GiB"
    except (ValueError, OSError):
        pass
    return {
        "cores": str(os.cpu_count()),
        "ram": ram,
        "cpu": cpu,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def postgres_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return f"PostgreSQL {cursor.fetchone()[0]}"


def rss_mb(pid: int) -> tuple[float, float]:
    """Resident memory of a process and its peak, in MiB (``/proc/<pid>/status``)."""
    values: dict[str, float] = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def machine_cpu() -> tuple[float, int]:
    """CPU seconds every process of this machine has used since boot, all cores together (user,
    nice, system, irq, softirq and steal of ``/proc/stat``, idle and iowait left out), and the
    number of cores. Read twice around a window, the difference over its length is how many
    cores were busy: the machine's own limit beside a scenario's figures."""
    with open("/proc/stat", encoding="utf-8") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy / os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: index 0 is field 3 (state)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        return stat.read().rpartition(")")[2].split()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a live process has used, in seconds (``/proc/<pid>/stat``)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float | None:
    """CPU seconds the PostgreSQL server has used: its postmaster, every live child (backends,
    background workers) and the children it has reaped; None when the server is not a process
    of this host (its backend's pid is not in ``/proc``, or it is not a postgres process).

    Read twice around a scenario, the difference is the server's CPU for that time, this
    process's own queries included.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    try:
        with open(f"/proc/{backend}/comm", encoding="utf-8") as comm:
            if not comm.read().startswith("postgres"):
                return None
        postmaster = int(_stat(backend)[1])
        fields = _stat(postmaster)
    except (OSError, ValueError):
        return None
    ticks = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                child = _stat(int(entry))
            except OSError:  # ended meanwhile
                continue
            if child[1] == str(postmaster):
                ticks += int(child[11]) + int(child[12])
    return ticks / os.sysconf("SC_CLK_TCK")
