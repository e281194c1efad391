"""Missed-run alerts on real PostgreSQL: which runs turn overdue, once, for one replica only;
the health probe, the metrics, the signals and the webhook (a real local HTTP server)."""

from __future__ import annotations

import io
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings
from prometheus_client import REGISTRY

from scheduling import health, ledger, signals, webhook
from scheduling.models import Run, TaskPolicy
from scheduling.overdue_watch import OverdueWatch
from scheduling.replicas import Heartbeat
from tests.webhook_server import Hook

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hook():
    server = Hook()
    webhook.connect()
    try:
        with override_settings(SCHEDULING_WEBHOOK_URL=server.url, SCHEDULING_WEBHOOK_RETRIES=0):
            yield server
    finally:
        webhook.disconnect()
        server.close()


def _run(task, ago: float, status: str = Run.Status.DISPATCHED, **fields) -> Run:
    slot = ledger.database_now() - timedelta(seconds=ago)
    return Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=slot,
        task_id=f"{task.pk}-{slot.timestamp()}-{status}-{fields.get('trigger', 'schedule')}",
        status=status, **fields,
    )


def _deadline(task, seconds: int | None) -> None:
    TaskPolicy.objects.create(periodic_task=task, success_deadline_seconds=seconds)


def test_runs_not_succeeded_past_the_deadline_are_marked_once(make_task):
    watched = make_task(every=3600, name="watched")
    _deadline(watched, 60)
    overdue = {
        _run(watched, 100, Run.Status.PENDING).pk,
        _run(watched, 101, Run.Status.DISPATCHED).pk,
        _run(watched, 102, Run.Status.RUNNING).pk,
        _run(watched, 103, Run.Status.FAILED).pk,
        _run(watched, 104, Run.Status.MISSED).pk,
        _run(watched, 105, Run.Status.EXPIRED).pk,
    }
    _run(watched, 110, Run.Status.SUCCEEDED)  # succeeded: kept its promise
    _run(watched, 111, Run.Status.SKIPPED)  # overlap or pause: never overdue
    _run(watched, 112, Run.Status.CANCELLED)
    _run(watched, 113, Run.Status.DISPATCHED, trigger=Run.Trigger.MANUAL)  # manual: not watched
    _run(watched, 114, Run.Status.DISPATCHED, trigger=Run.Trigger.BACKFILL)
    _run(watched, 30, Run.Status.RUNNING)  # 30 s after its slot: not yet
    unwatched = make_task(every=3600, name="no deadline")
    _run(unwatched, 500, Run.Status.DISPATCHED)
    _deadline(make_task(every=3600, name="empty policy"), None)

    found = ledger.mark_overdue(None)

    assert {run.run_id for run in found} == overdue
    assert [run.status for run in found] == [
        "expired", "missed", "failed", "running", "dispatched", "pending"  # oldest slot first
    ]
    assert {run.deadline_seconds for run in found} == {60.0}
    assert set(Run.objects.filter(overdue_at__isnull=False).values_list("pk", flat=True)) == overdue
    assert ledger.mark_overdue(None) == []


def test_the_global_deadline_applies_to_tasks_without_their_own(make_task):
    default = make_task(every=3600, name="default")
    own = make_task(every=3600, name="own")
    _deadline(own, 600)
    late = _run(default, 200)
    _run(own, 200)  # within its own 600 s

    assert [run.run_id for run in ledger.mark_overdue(120.0)] == [late.pk]
    assert ledger.mark_overdue(None) == []


def test_a_run_held_by_another_session_is_skipped_then_marked(make_task, raw_connection):
    task = make_task(every=3600)
    _deadline(task, 10)
    held = _run(task, 20)
    raw_connection.execute("SELECT 1 FROM scheduling_run WHERE id = %s FOR UPDATE", [held.pk])
    assert ledger.mark_overdue(None) == []  # a claim or an outcome holds it: no wait
    raw_connection.rollback()
    assert [run.run_id for run in ledger.mark_overdue(None)] == [held.pk]


def test_concurrent_passes_report_each_run_once(make_task):
    tasks = [make_task(every=3600) for _ in range(4)]
    ids = set()
    for task in tasks:
        _deadline(task, 5)
        ids |= {_run(task, 10 + n).pk for n in range(50)}
    results: list[list[int]] = []
    start = threading.Barrier(4)

    def replica() -> None:
        try:
            start.wait()
            mine: list[int] = []
            while batch := ledger.mark_overdue(None, limit=30):
                mine.extend(run.run_id for run in batch)
            results.append(mine)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    reported = [run_id for batch in results for run_id in batch]
    assert len(results) == 4
    assert sorted(reported) == sorted(ids)  # every run once, none twice


def _health() -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("scheduling_health", stdout=out, stderr=err)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_health_names_overdue_tasks_until_a_later_run_succeeds(make_task):
    Heartbeat("replica-1").beat()
    digest, report = make_task(every=60, name="digest"), make_task(every=60, name="nightly 'report'")
    for task in (digest, report):
        _deadline(task, 30)
        _run(task, 100)
        _run(task, 90, Run.Status.FAILED)
    ledger.mark_overdue(None)
    oldest = {
        task.name: Run.objects.filter(periodic_task=task).order_by("scheduled_for")[0].scheduled_for
        for task in (digest, report)
    }

    assert health.overdue_tasks(3600) == [
        health.OverdueTask("digest", 2, oldest["digest"]),
        health.OverdueTask("nightly 'report'", 2, oldest["nightly 'report'"]),
    ]
    assert _health() == (
        1, "", (
            "unhealthy: 2 tasks overdue (no run succeeded within its deadline): 'digest', "
            "\"nightly 'report'\"\n"
        ),
    )
    _run(digest, 20, Run.Status.SUCCEEDED)  # a later run succeeded: digest is fine again
    assert _health() == (
        1, "", "unhealthy: 1 task overdue (no run succeeded within its deadline): \"nightly 'report'\"\n",
    )
    Run.objects.filter(periodic_task=report, status=Run.Status.FAILED).update(
        status=Run.Status.SUCCEEDED  # the overdue run's own late success ends it too
    )
    assert _health() == (
        0, "ok: 1 replica ticked within 30 s; no run pending more than 120 s past the slot\n", ""
    )


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_pass_reports_each_overdue_run_once_signal_webhook_metric(
    make_task, hook, metrics_served
):
    task = make_task(every=60, name="alerted")
    _deadline(task, 30)
    run = _run(task, 45)
    in_transaction: list[bool] = []

    def receiver(sender, event, **_):
        in_transaction.append(connection.in_atomic_block)

    signals.run_overdue.connect(receiver)
    before = _sample("scheduling_runs_overdue_total", task="alerted", replica="replica-x")
    try:
        watch = OverdueWatch("replica-x")
        found = watch.step()
        assert watch.step() == []  # within the interval: no second pass
        assert OverdueWatch("replica-y").step() == []  # another replica: already reported
    finally:
        signals.run_overdue.disconnect(receiver)
    assert webhook.outbox.wait_idle(10)

    assert [r.run_id for r in found] == [run.pk]
    assert in_transaction == [False]
    run.refresh_from_db()
    assert hook.documents == [{
        "event": "run.overdue",
        "event_id": f"run.overdue:{run.task_id}",
        "run_id": run.pk,
        "task_id": run.task_id,
        "periodic_task_id": task.pk,
        "periodic_task": "alerted",
        "task": "project.tasks.record",
        "scheduled_for": run.scheduled_for.isoformat(timespec="milliseconds"),
        "status": "dispatched",
        "deadline_seconds": 30.0,
        "overdue_at": run.overdue_at.isoformat(timespec="milliseconds"),
        "replica": "replica-x",
    }]
    assert hook.content_types == ["application/json"]
    assert _sample("scheduling_runs_overdue_total", task="alerted", replica="replica-x") == before + 1
    assert _sample("scheduling_runs_overdue_total", task="alerted", replica="replica-y") == 0
    assert _sample("scheduling_task_overdue_runs", task="alerted") == 1


def test_an_outcome_recorded_by_the_worker_is_announced(make_task, hook):
    task = make_task(every=60, name="finished")
    run = _run(task, 5, Run.Status.RUNNING, worker="w1")
    assert ledger.record_finished(run.task_id, Run.Status.SUCCEEDED)
    signals.announce_finished(run.task_id)
    assert webhook.outbox.wait_idle(10)
    run.refresh_from_db()
    assert hook.documents == [{
        "event": "run.finished",
        "event_id": f"run.finished:{run.task_id}:0",
        "run_id": run.pk,
        "task_id": run.task_id,
        "periodic_task_id": task.pk,
        "periodic_task": "finished",
        "task": "project.tasks.record",
        "trigger": "schedule",
        "scheduled_for": run.scheduled_for.isoformat(timespec="milliseconds"),
        "status": "succeeded",
        "reason": "",
        "error": "",
        "worker": "w1",
        "started_at": None,
        "finished_at": run.finished_at.isoformat(timespec="milliseconds"),
        "executions": 0,
    }]


def test_a_run_the_claim_ends_is_announced_by_the_replica(make_task, hook):
    from project.celery import app
    from scheduling.schedulers import LedgerScheduler

    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start, args="not json", name="bad args")
    scheduler = LedgerScheduler(app=app)
    for _ in range(3):
        scheduler.tick()
    assert webhook.outbox.wait_idle(10)

    run = Run.objects.get(periodic_task=task, scheduled_for=start)
    assert [(d["event"], d["run_id"], d["status"], d["reason"]) for d in hook.documents] == [
        ("run.finished", run.pk, Run.Status.FAILED, run.reason)
    ]
    assert run.reason == Run.Reason.REJECTED
