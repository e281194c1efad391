"""Real processes for acceptance tests: beat replicas and workers against the test database.

A Deployment starts ``celery beat`` replicas with LedgerScheduler and ``celery worker`` processes
as children, with DATABASE_URL pointing at pytest-django's test database and a queue of its own on
the configured broker (CELERY_BROKER_URL: Redis or RabbitMQ; unset, kombu's SQL transport), so
tests never see each other's messages; ``stop()`` of the whole deployment deletes that queue from
Redis or RabbitMQ. Workers run ``project.tasks.record``, which appends one JSON line per execution
to a file: the count of executions comes from the worker, not the ledger.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from scheduling.models import Run
from tests.acceptance.pausing import PAUSE_VARIABLE
from tools.processes import Processes

ROOT = Path(__file__).resolve().parents[2]
PAUSING_SCHEDULER = "tests.acceptance.pausing:PausingScheduler"


def wait_until(predicate, timeout: float, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def drain(timeout: float = 30.0, limit: float = 600.0) -> None:
    """Wait until the workers have finished every dispatched run.

    Gives up (AssertionError naming the runs) when no run has finished for ``timeout`` seconds,
    or after ``limit`` seconds in all: a worker on a busy machine drains its backlog slowly, and
    how slowly is the machine's speed; a stuck run makes no progress.
    """
    unfinished = Run.objects.filter(
        status__in=(Run.Status.DISPATCHED, Run.Status.RUNNING, Run.Status.RETRYING)
    )
    started = progressed = time.monotonic()
    left = unfinished.count()
    while left:
        now = time.monotonic()
        if now - progressed > timeout or now - started > limit:
            stuck = list(unfinished.values_list("periodic_task_name", "scheduled_for", "status"))
            raise AssertionError(
                f"runs never finished ({left} left, none finished in {now - progressed:.0f} s,"
                f" {now - started:.0f} s in all): {stuck}"
            )
        time.sleep(0.05)
        count = unfinished.count()
        if count < left:
            progressed = time.monotonic()
        left = count


def executed_once(runs: list[Run], executions: list[dict[str, object]]) -> dict[str, Run]:
    """Assert the workers executed each of ``runs`` once and nothing else; return them by task id.

    ``executions`` are the workers' own records (``Processes.executions()``).
    """
    executed = Counter(e["task_id"] for e in executions)
    twice = [task_id for task_id, n in executed.items() if n > 1]
    assert twice == [], f"executed more than once: {twice}"
    by_id = {run.task_id: run for run in runs}
    never = [(run.periodic_task_name, run.scheduled_for, run.status, run.reason)
             for task_id, run in by_id.items() if task_id not in executed]
    assert never == [], f"in the ledger, never executed: {never}"
    unknown = sorted(set(executed) - set(by_id))
    assert unknown == [], f"executed, not in the ledger: {unknown}"
    return by_id


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


class Deployment(Processes):
    """Child processes of one acceptance test, on the test database and a queue of their own."""

    def __init__(self, workdir: Path, **env: str) -> None:
        super().__init__(
            workdir,
            queue=f"q-{uuid.uuid4().hex[:10]}",
            cwd=ROOT,
            env={
                "DATABASE_URL": test_database_url(),
                "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
                **env,
            },
        )
        self.env["CELERY_TASK_DEFAULT_QUEUE"] = self.queue

    def stop(self, *names: str, timeout: float = 20.0, warm: bool = False) -> None:
        """Stop the named processes; with no name, every process, then delete the queue."""
        super().stop(*names, timeout=timeout, warm=warm)
        if not names:
            delete_queue(self.queue)

    def start_beat(
        self, name: str, *, pause_after_publish: float = 0.0, **env: str
    ) -> subprocess.Popen[bytes]:
        """Start a beat replica ``name``; with ``pause_after_publish`` (seconds), a pausing one.

        A pausing replica (``tests.acceptance.pausing``, importable from ROOT, the replicas'
        working directory) logs "test pause: published <task ids>" after publishing a claim's
        runs and stays inside the claim transaction that long before committing.
        """
        if not pause_after_publish:
            return super().start_beat(name, **env)
        return super().start_beat(
            name, scheduler=PAUSING_SCHEDULER, **{PAUSE_VARIABLE: str(pause_after_publish), **env}
        )

    def publish_copy(self, run: object) -> None:
        """Publish the scheduler's message of ``run`` again, as a re-publishing replica would."""
        from project.celery import app
        from scheduling.run_message import build_message

        message = build_message(run, run.periodic_task)  # type: ignore[attr-defined]
        options = {**message.options, "queue": self.queue}
        app.send_task(message.task, args=message.args, kwargs=message.kwargs, **options)


def broker_is_redis() -> bool:
    """Return True when the acceptance tests run against Redis (CELERY_BROKER_URL)."""
    return settings.CELERY_BROKER_URL.startswith("redis://")


def broker_is_amqp() -> bool:
    """Return True when the acceptance tests run against RabbitMQ (an ``amqp://`` URL)."""
    return settings.CELERY_BROKER_URL.startswith(("amqp://", "pyamqp://"))


def delete_queue(queue: str) -> None:
    """Delete ``queue`` from Redis or RabbitMQ (its exchange of the same name too), if it exists.

    kombu's SQL transport keeps its queues in the test database, which pytest-django drops.
    """
    if broker_is_redis():
        import redis

        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)
    elif broker_is_amqp():
        from kombu import Connection

        with Connection(settings.CELERY_BROKER_URL, connect_timeout=5) as broker:
            channel = broker.channel()
            channel.queue_delete(queue)  # both are no-ops when the name does not exist
            channel.exchange_delete(queue)  # Celery's default exchange is named after the queue


def broker_task_ids(queue: str, waiting_only: bool = False) -> list[str]:
    """Return the task ids of the messages waiting in ``queue``, without consuming them.

    Reads Redis lists directly, or kombu's SQL transport tables (which also keep delivered
    messages, marked invisible, unless ``waiting_only``), so a test can count what reached the
    broker. On RabbitMQ the waiting messages are fetched with ``basic.get`` and not acknowledged,
    so closing the channel puts them back, in order, flagged ``redelivered``; messages a
    consumer holds unacknowledged are not seen.
    """
    url = settings.CELERY_BROKER_URL
    if broker_is_amqp():
        return _amqp_task_ids(url, queue)
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


def _amqp_task_ids(url: str, queue: str) -> list[str]:
    from amqp.exceptions import NotFound
    from kombu import Connection

    ids = []
    with Connection(url, connect_timeout=5) as broker:
        channel = broker.channel()
        try:
            while (message := channel.basic_get(queue, no_ack=False)) is not None:
                ids.append(message.properties["application_headers"]["id"])
        except NotFound:  # never declared: nothing was published to it
            return []
        channel.close()  # not acknowledged: requeued
    return ids
