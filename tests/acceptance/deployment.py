"""Real processes for acceptance tests: beat replicas and workers against the test database.

A Deployment starts ``celery beat`` replicas with LedgerScheduler and ``celery worker`` processes
as children, with DATABASE_URL pointing at pytest-django's test database and a queue of its own on
the configured broker (Redis when CELERY_BROKER_URL is set, else kombu's SQL transport), so tests
never see each other's messages. Workers run ``project.tasks.record``, which appends one JSON line
per execution to a file: the count of executions comes from the worker, not the ledger.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from scheduling.models import Run

ROOT = Path(__file__).resolve().parents[2]


def wait_until(predicate, timeout: float, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def drain(timeout: float = 30.0) -> None:
    """Wait until the worker has finished every dispatched run."""
    unfinished = Run.objects.filter(
        status__in=(Run.Status.DISPATCHED, Run.Status.RUNNING, Run.Status.RETRYING)
    )
    try:
        wait_until(lambda: not unfinished.exists(), timeout)
    except AssertionError:
        stuck = list(unfinished.values_list("periodic_task_name", "scheduled_for", "status"))
        raise AssertionError(f"runs never finished: {stuck}") from None


def test_database_url() -> str:
    """Return a URL for the database this test session uses (pytest-django's test_ database)."""
    params = connection.get_connection_params()
    host = str(params.get("host") or "")
    user = quote(str(params.get("user") or ""))
    password = quote(str(params.get("password") or ""))
    auth = f"{user}:{password}@" if password else f"{user}@"
    port = f":{params['port']}" if params.get("port") else ""
    name = connection.settings_dict["NAME"]
    if host.startswith("/"):  # a Unix socket folder (the embedded server)
        return f"postgresql://{auth}/{name}?host={quote(host)}"
    return f"postgresql://{auth}{host}{port}/{name}"


class Deployment:
    """Child processes of one acceptance test; ``stop()`` ends them all."""

    def __init__(self, workdir: Path, **env: str) -> None:
        self.workdir = workdir
        self.queue = f"q-{uuid.uuid4().hex[:10]}"
        self.execution_log = workdir / "executions.jsonl"
        self.execution_log.touch()
        self.env = {
            **os.environ,
            "DATABASE_URL": test_database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "CELERY_TASK_DEFAULT_QUEUE": self.queue,
            "SCHEDULING_EXECUTION_LOG": str(self.execution_log),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        handle = open(self.log_path(name), "ab")  # noqa: SIM115 - owned by the child
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "project", *args],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def start_beat(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        """Start a beat replica whose replica id is ``name``."""
        return self._start(
            name,
            ["beat", "-l", "info", "--pidfile=", "-S", "scheduling.schedulers:LedgerScheduler"],
            {"SCHEDULING_REPLICA_ID": name, **env},
        )

    def start_worker(self, name: str, concurrency: int = 2) -> subprocess.Popen[bytes]:
        return self._start(
            name,
            [
                "worker", "-l", "info", "-c", str(concurrency), "-n", f"{name}@%h",
                "-Q", self.queue, "--without-gossip", "--without-mingle", "--without-heartbeat",
            ],
            {},
        )

    def wait_for_log(self, name: str, text: str, timeout: float = 30.0) -> float:
        """Wait until ``text`` appears in the log of ``name``; return time.time() when seen."""
        deadline = time.monotonic() + timeout
        path = self.log_path(name)
        while time.monotonic() < deadline:
            if path.exists() and text in path.read_text(errors="replace"):
                return time.time()
            process = self.processes.get(name)
            if process is not None and process.poll() is not None:
                raise AssertionError(f"{name} exited early:\n{self.tail(name)}")
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not seen in {name} within {timeout}s:\n{self.tail(name)}")

    def wait_ready(self) -> None:
        for name in self.processes:
            marker = "beat: Starting..." if "worker" not in name else "ready."
            self.wait_for_log(name, marker, timeout=60)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.processes[name]
        os.killpg(process.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            process.wait(timeout=30)

    def stop(self, *names: str, timeout: float = 20.0) -> None:
        """Stop the named processes (all when none is named): SIGTERM, then SIGKILL."""
        targets = [self.processes[n] for n in names] if names else list(self.processes.values())
        for process in targets:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for process in targets:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)

    def executions(self, phase: str = "end") -> list[dict[str, object]]:
        """Every execution the workers recorded, in order (``phase="start"``: every start)."""
        lines = self.execution_log.read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        return [r for r in records if r.get("phase", "end") == phase]

    def publish_copy(self, run: object) -> None:
        """Publish the scheduler's message of ``run`` again, as a re-publishing replica would."""
        from project.celery import app
        from scheduling.messages import build_message

        message = build_message(run, run.periodic_task)  # type: ignore[attr-defined]
        options = {**message.options, "queue": self.queue}
        app.send_task(message.name, args=message.args, kwargs=message.kwargs, **options)

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log_path(name)
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def broker_is_redis() -> bool:
    """Return True when the acceptance tests run against Redis (CELERY_BROKER_URL)."""
    return settings.CELERY_BROKER_URL.startswith("redis://")


def broker_task_ids(queue: str, waiting_only: bool = False) -> list[str]:
    """Return the task ids of the messages waiting in ``queue``, without consuming them.

    Reads Redis lists directly, or kombu's SQL transport tables (which also keep delivered
    messages, marked invisible, unless ``waiting_only``), so a test can count what reached the
    broker.
    """
    url = settings.CELERY_BROKER_URL
    if url.startswith("redis://"):
        import redis

        client = redis.Redis.from_url(url)
        payloads = client.lrange(queue, 0, -1)
    elif url.startswith("sqlpoll+"):
        import psycopg

        dsn = url.removeprefix("sqlpoll+").replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT m.payload FROM kombu_message m JOIN kombu_queue q ON q.id = m.queue_id"
                " WHERE q.name = %s AND (m.visible OR NOT %s) ORDER BY m.id",
                [queue, waiting_only],
            ).fetchall()
        payloads = [row[0] for row in rows]
    else:
        raise NotImplementedError(f"cannot peek into broker {url.split(':', 1)[0]}")
    return [json.loads(payload)["headers"]["id"] for payload in payloads]
