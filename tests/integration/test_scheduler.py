"""LedgerScheduler in this process against real PostgreSQL and the configured broker."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from celery import schedules
from django.core.checks import run_checks
from django.test import override_settings
from django_celery_beat.models import PeriodicTask, PeriodicTasks

from project.celery import app
from scheduling import ledger
from scheduling.beat_schedule import sync_beat_schedule
from scheduling.models import Run
from scheduling.schedulers import LedgerScheduler

pytestmark = pytest.mark.django_db(transaction=True)


def _scheduler() -> LedgerScheduler:
    return LedgerScheduler(app=app)


def test_tick_plans_dispatches_and_sleeps_at_most_the_max_interval(make_task):
    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start)  # first slot: start_time, already due
    scheduler = _scheduler()
    delays = [scheduler.tick() for _ in range(3)]

    run = Run.objects.get(periodic_task=task, scheduled_for=start)
    assert (run.status, run.claimed_by) == (Run.Status.DISPATCHED, scheduler.replica_id)
    assert all(0 <= d <= 0.5 for d in delays)
    assert delays[-1] == 0.5  # nothing due within the default max interval: all of it
    nxt = Run.objects.pending().get(periodic_task=task)
    assert nxt.scheduled_for == start + timedelta(hours=1)


def test_unknown_task_name_fails_its_run_with_a_clear_error(make_task, caplog):
    start = ledger.database_now() - timedelta(seconds=0.5)
    unknown = make_task(every=3600, start_time=start, task="nowhere.tasks.missing", name="lost")
    known = make_task(every=3600, start_time=start)
    scheduler = _scheduler()
    # Celery's Django fixup re-ran the logging configuration, which dropped caplog's handler
    logging.getLogger().addHandler(caplog.handler)
    for _ in range(3):
        scheduler.tick()

    bad = Run.objects.get(periodic_task=unknown, scheduled_for=start)
    error = "unknown task name 'nowhere.tasks.missing': not registered in this app"
    assert (bad.status, bad.reason, bad.error) == (
        Run.Status.FAILED, "rejected before dispatch", error
    )
    assert f"run of 'lost' at {start} rejected: {error}" in caplog.messages
    assert Run.objects.get(periodic_task=known, scheduled_for=start).status == "dispatched"
    # both keep their schedules
    assert Run.objects.pending().filter(periodic_task__in=[unknown, known]).count() == 2


def test_an_edit_is_picked_up_on_the_next_tick(make_task):
    task = make_task(cron="0 3 * * *")
    scheduler = _scheduler()
    scheduler.tick()
    assert Run.objects.pending().get(periodic_task=task).scheduled_for.hour == 3
    task.crontab = type(task.crontab).objects.create(minute="0", hour="5", timezone="UTC")
    task.save()
    scheduler.tick()
    assert Run.objects.pending().get(periodic_task=task).scheduled_for.hour == 5


def test_idle_tick_is_one_query(make_task, django_assert_num_queries):
    for _ in range(30):
        make_task(every=3600)
    scheduler = _scheduler()
    scheduler.tick()  # startup: reconcile, plan
    with django_assert_num_queries(1):
        assert scheduler.tick() == 0.5


def test_sync_beat_schedule_is_idempotent_and_triggers_no_reload():
    entries = {
        "hourly report": {"task": "project.tasks.record", "schedule": schedules.crontab(minute=0)},
        "heartbeat": {"task": "project.tasks.record", "schedule": 10.0, "args": ["hb"]},
    }
    sync_beat_schedule(entries)
    marker = PeriodicTasks.last_change()
    changed = dict(PeriodicTask.objects.values_list("name", "date_changed"))
    time.sleep(0.01)
    sync_beat_schedule(entries)
    sync_beat_schedule(entries)

    assert PeriodicTasks.last_change() == marker
    assert dict(PeriodicTask.objects.values_list("name", "date_changed")) == changed
    heartbeat = PeriodicTask.objects.get(name="heartbeat")
    assert (heartbeat.interval.every, heartbeat.interval.period, heartbeat.args) == (
        10, "seconds", '["hb"]'
    )


def test_use_tz_off_is_a_system_check_error():
    with override_settings(USE_TZ=False):
        errors = [e for e in run_checks() if e.id == "scheduling.E001"]
    assert len(errors) == 1
    assert "USE_TZ = True" in errors[0].hint


def test_broker_down_leaves_runs_pending_and_the_replica_alive(make_task):
    """Nothing is marked dispatched unless its publish succeeded; the tick never raises."""
    import logging

    from celery import Celery


    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start)
    broken = Celery("broken", broker="redis://127.0.0.1:1/0")
    # Celery prefers the CELERY_BROKER_URL environment variable to the app's own broker.
    with pytest.MonkeyPatch.context() as patch, override_settings(
        SCHEDULING_REJECT_UNKNOWN_TASKS=False
    ):
        patch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")
        scheduler = LedgerScheduler(app=broken)
        # attach after start-up: Celery's Django fixup re-runs Django's logging configuration
        records: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("scheduling.schedulers").addHandler(handler)
        delays = [scheduler.tick() for _ in range(3)]

    run = Run.objects.get(periodic_task=task, scheduled_for=start)
    assert run.status == Run.Status.PENDING
    assert all(d > 0 for d in delays[1:])
    logging.getLogger("scheduling.schedulers").removeHandler(handler)
    assert sum("broker unavailable, retrying with backoff" in r for r in records) == 1

    healthy = _scheduler()
    for _ in range(3):
        healthy.tick()
    run.refresh_from_db()
    assert run.status == Run.Status.DISPATCHED


def test_concurrent_beat_schedule_syncs_create_each_task_and_schedule_row_once():
    """Eight threads (eight connections) sync the same entries at once: no duplicate, no update."""
    import threading

    from django.db import connections
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule

    from scheduling.models import ScheduleChange

    entries = {
        f"entry {i}": {
            "task": "project.tasks.record",
            "schedule": schedules.crontab(minute=i) if i % 2 else 20.0 + i,
        }
        for i in range(5)
    }
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def sync() -> None:
        try:
            barrier.wait()
            sync_beat_schedule(entries)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sync) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert sorted(PeriodicTask.objects.values_list("name", flat=True)) == sorted(entries)
    assert sorted(IntervalSchedule.objects.values_list("every", flat=True)) == [20, 22, 24]
    assert sorted(CrontabSchedule.objects.values_list("minute", flat=True)) == ["1", "3"]
    # no task was updated after its creation; each creation is logged once, to be planned
    assert sorted(ScheduleChange.objects.values_list("kind", "object_id")) == sorted(
        (ScheduleChange.Kind.UNPLANNED, pk)
        for pk in PeriodicTask.objects.values_list("pk", flat=True)
    )
