"""Tools that hook Celery beat and the worker see each run once, with the real libraries.

Sentry Crons (sentry-sdk's ``CeleryIntegration(monitor_beat_tasks=True)``, which wraps beat's
``Scheduler.apply_entry``), OpenTelemetry's Celery instrumentation and django-celery-results, each
set up in the replicas and the worker by a settings module of its own (``settings_sentry``,
``settings_otel``, ``settings_results``). Executions are counted from the worker's own log
(``project.tasks.record``); what each tool received is read from where it sent it: a local Sentry
server (``sentry_inbox``), a span file (``span_log``), the result table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import partial

import pytest
from django.db import connection, transaction
from django_celery_beat.models import PeriodicTask

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import (
    ROOT,
    Deployment,
    drain,
    executed_once,
    wait_until,
)
from tests.acceptance.deployment import (
    test_database_url as database_url,
)
from tests.acceptance.sentry_inbox import SentryInbox

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]

RECORD = "project.tasks.record"
#: Sentry Crons takes intervals of whole minutes only: the shortest is 60 s.
MINUTE = 60


def _start(deployment: Deployment, settings: str, replicas: int, **env: str) -> None:
    """Start ``replicas`` beat replicas and one worker on ``settings``; wait until they are up.

    Each process is given OTEL_SERVICE_NAME, its own name (read by OpenTelemetry only).
    """
    deployment.env.update(DJANGO_SETTINGS_MODULE=settings, **env)
    for n in range(1, replicas + 1):
        deployment.start_beat(f"replica-{n}", OTEL_SERVICE_NAME=f"replica-{n}")
    deployment.start_worker("worker-1", concurrency=2, OTEL_SERVICE_NAME="worker-1")
    deployment.wait_ready()


def _finish(deployment: Deployment, replicas: int) -> None:
    """Stop the replicas, let the worker finish every dispatched run, stop the worker."""
    deployment.stop(*(f"replica-{n}" for n in range(1, replicas + 1)))
    drain()
    deployment.stop("worker-1")


def _executed(deployment: Deployment) -> dict[str, Run]:
    """The dispatched runs by task id, each asserted executed once by the worker (its log)."""
    return executed_once(list(Run.objects.exclude(dispatched_at=None)), deployment.executions())


def _settled(read, timeout: float) -> list:
    """``read()`` once it is not empty and has not grown for a second, or after ``timeout``
    seconds (what it returns then)."""
    deadline = time.monotonic() + timeout
    seen = read()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = read()
        if len(now) == len(seen) and now:
            return now
        seen = now
    return seen


# --- Sentry Crons ---------------------------------------------------------------------------

#: Each monitor's schedule in its check-ins' ``monitor_config`` (beside ``"timezone": "UTC"``,
#: CELERY_TIMEZONE).
SENTRY_SCHEDULES = {
    "every-minute": {"type": "interval", "value": 1, "unit": "minute"},
    "every-minute-failing": {"type": "interval", "value": 1, "unit": "minute"},
    "each-minute-crontab": {"type": "crontab", "value": "* * * * *"},
}
#: When both replicas are frozen (SIGSTOP), in seconds after the first slot: the slot of the task
#: ``missed`` (first slot + 15 s, misfire grace 1 s, skip policy) passes meanwhile.
FROZEN = (13, 19)


def _sentry_tasks(make_task, start: datetime) -> dict[str, PeriodicTask]:
    """The tasks: two 60 s intervals from ``start`` (one raising), a ``* * * * *`` crontab; and
    60 s intervals whose first run is not executed: ``missed`` (its slot passes while the
    replicas are frozen), ``paused`` and ``disabled`` (paused, disabled once their first run is
    planned, 5 s after ``start``: skipped, cancelled when due)."""
    every = partial(make_task, every=MINUTE)
    tasks = {
        "every-minute": every(start_time=start, name="every-minute"),
        "every-minute-failing": every(
            start_time=start, name="every-minute-failing",
            kwargs=json.dumps({"label": "failing", "fail": True}),
        ),
        "each-minute-crontab": make_task(cron="* * * * *", name="each-minute-crontab"),
    }
    with transaction.atomic():  # no replica sees the task before its policy
        tasks["missed"] = every(start_time=start + timedelta(seconds=15), name="missed")
        TaskPolicy.objects.create(
            periodic_task=tasks["missed"],
            misfire_policy=TaskPolicy.Misfire.SKIP,
            misfire_grace_seconds=1,
        )
    later = start + timedelta(seconds=5)
    tasks["paused"] = every(start_time=later, name="paused")
    tasks["disabled"] = every(start_time=later, name="disabled")
    planned = Run.objects.filter(periodic_task__in=[tasks["paused"], tasks["disabled"]])
    wait_until(lambda: planned.count() == 2, timeout=10)  # a paused task is not planned
    ledger.pause(tasks["paused"], by="test", why="not monitored")
    tasks["disabled"].enabled = False
    tasks["disabled"].save()
    return tasks


def _freeze_replicas(deployment: Deployment, start: datetime) -> None:
    """Freeze both replicas (SIGSTOP) over the FROZEN seconds after ``start``, then thaw them."""
    for offset, sig in zip(FROZEN, (signal.SIGSTOP, signal.SIGCONT), strict=True):
        time.sleep(max(0.0, (start - ledger.database_now()).total_seconds() + offset))
        for name in ("replica-1", "replica-2"):
            deployment.send(name, sig)


def _ended(task: PeriodicTask) -> list[str]:
    """The statuses of ``task``'s runs that ended, in slot order."""
    runs = Run.objects.filter(periodic_task=task).exclude(status=Run.Status.PENDING)
    return list(runs.order_by("scheduled_for").values_list("status", flat=True))


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def _pairs(check_ins: list[dict]) -> dict[str, Counter]:
    """Per monitor slug, how many check-in ids had each sorted tuple of statuses."""
    by_id: dict[tuple[str, str], list[str]] = {}
    for check_in in check_ins:
        key = (check_in["monitor_slug"], check_in["check_in_id"])
        by_id.setdefault(key, []).append(check_in["status"])
    pairs: dict[str, Counter] = {}
    for (slug, _), statuses in by_id.items():
        pairs.setdefault(slug, Counter())[tuple(sorted(statuses))] += 1
    return pairs


@pytest.mark.timeout(240)
def test_sentry_crons_get_one_check_in_pair_per_executed_run(deployment: Deployment, make_task):
    """Two replicas, one worker: ``in_progress`` then ``ok``/``error`` under one check-in id for
    each run the worker executed; nothing for a paused task's skipped run, a missed run or a
    cancelled one. About 75 s: the 60 s tasks' first two slots."""
    pytest.importorskip("sentry_sdk", reason="sentry-sdk is not installed for this Python")
    inbox = SentryInbox()
    try:
        _start(deployment, "tests.acceptance.settings_sentry", 2, SENTRY_DSN=inbox.dsn)
        start = ledger.database_now() + timedelta(seconds=3)
        tasks = _sentry_tasks(make_task, start)
        _freeze_replicas(deployment, start)
        wait_until(
            lambda: _ended(tasks["every-minute"]) == ["succeeded"] * 2
            and _ended(tasks["every-minute-failing"]) == ["failed"] * 2,
            timeout=MINUTE + 60,
        )
        _finish(deployment, 2)
        check_ins = _settled(inbox.check_ins, timeout=10)
    finally:
        inbox.close()

    executions = Counter(run.periodic_task_name for run in _executed(deployment).values())
    crontab_runs = executions["each-minute-crontab"]
    assert crontab_runs >= 1
    assert executions == {
        "every-minute": 2, "every-minute-failing": 2, "each-minute-crontab": crontab_runs,
    }
    assert [_ended(tasks[name]) for name in ("paused", "missed", "disabled")] == [
        ["skipped"], ["missed"], ["cancelled"]
    ]
    assert inbox.errors == []
    # the SDK runs and reaches the inbox: the worker reported each failure of the raising task
    assert inbox.exceptions("RuntimeError") == ["failing failed on purpose"] * 2
    assert _pairs(check_ins) == {
        "every-minute": {("in_progress", "ok"): 2},
        "every-minute-failing": {("error", "in_progress"): 2},
        "each-minute-crontab": {("in_progress", "ok"): crontab_runs},
    }
    configs = {(c["monitor_slug"], _json(c.get("monitor_config"))) for c in check_ins}
    assert configs == {
        (slug, _json({"schedule": schedule, "timezone": "UTC"}))
        for slug, schedule in SENTRY_SCHEDULES.items()
    }


# --- OpenTelemetry --------------------------------------------------------------------------

MESSAGE_ID = "messaging.message.id"


def test_opentelemetry_traces_each_execution_under_its_replicas_publish(
    deployment: Deployment, make_task
):
    """Two replicas, one worker: one ``run/`` span per execution, the child of the one
    ``apply_async/`` span a replica made when it published that run (same trace)."""
    pytest.importorskip(
        "opentelemetry.instrumentation.celery",
        reason="opentelemetry-instrumentation-celery is not installed for this Python",
    )
    from tests.acceptance.span_log import SPAN_LOG, read_spans

    span_log = deployment.workdir / "spans.jsonl"
    _start(deployment, "tests.acceptance.settings_otel", 2, **{SPAN_LOG: str(span_log)})
    start = ledger.database_now() + timedelta(seconds=1)
    task = make_task(every=2, start_time=start, name="traced every 2 s")
    wait_until(lambda: _ended(task)[:4] == ["succeeded"] * 4, timeout=60)
    _finish(deployment, 2)

    runs = _executed(deployment)
    spans = read_spans(span_log)
    assert Counter(s["name"] for s in spans) == {
        f"apply_async/{RECORD}": len(runs), f"run/{RECORD}": len(runs),
    }
    published = {s["attributes"][MESSAGE_ID]: s for s in spans if s["kind"] == "PRODUCER"}
    executed = {s["attributes"][MESSAGE_ID]: s for s in spans if s["kind"] == "CONSUMER"}
    assert set(published) == set(executed) == set(runs)
    assert {s["service"] for s in published.values()} <= {"replica-1", "replica-2"}
    assert {s["service"] for s in executed.values()} == {"worker-1"}
    assert {tid: (s["trace_id"], s["parent_id"]) for tid, s in executed.items()} == {
        tid: (s["trace_id"], s["span_id"]) for tid, s in published.items()
    }
    assert len({s["trace_id"] for s in published.values()}) == len(runs)


# --- django-celery-results ------------------------------------------------------------------

RESULTS_SETTINGS = "tests.acceptance.settings_results"


def _migrate_results(target: str = "") -> None:
    """Migrate django_celery_results in the test database (``target="zero"``: unmigrate)."""
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "django_celery_results", *filter(None, [target]),
         "-v", "0"],
        cwd=ROOT, check=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": RESULTS_SETTINGS,
             "DATABASE_URL": database_url()},
    )


@pytest.fixture
def result_tables(transactional_db) -> Iterator[None]:
    """django-celery-results' tables in the test database for one test, dropped at its end."""
    pytest.importorskip(
        "django_celery_results", reason="django-celery-results is not installed for this Python"
    )
    _migrate_results()
    try:
        yield
    finally:
        _migrate_results("zero")


def test_django_celery_results_keeps_one_result_per_execution(
    deployment: Deployment, make_task, result_tables
):
    """Two replicas, one worker, ``CELERY_RESULT_BACKEND = "django-db"``: one TaskResult per
    execution, under the run's task id, SUCCESS."""
    _start(deployment, RESULTS_SETTINGS, 2)
    start = ledger.database_now() + timedelta(seconds=1)
    task = make_task(every=2, start_time=start, name="stored every 2 s")
    wait_until(lambda: _ended(task)[:4] == ["succeeded"] * 4, timeout=60)
    _finish(deployment, 2)

    runs = _executed(deployment)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT task_id, status, task_name, periodic_task_name"
            " FROM django_celery_results_taskresult ORDER BY task_id"
        )
        rows = cursor.fetchall()
    assert rows == [
        (run.task_id, "SUCCESS", RECORD, "stored every 2 s") for _, run in sorted(runs.items())
    ]
