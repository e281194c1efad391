"""Edits of periodic tasks and shared schedule rows, however made, re-plan within one tick."""

from __future__ import annotations

import importlib
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask, PeriodicTasks

from project.celery import app
from scheduling import ledger, slots
from scheduling.ledger import changes
from scheduling.ledger.changes import recent_changes
from scheduling.models import Run, ScheduleChange
from scheduling.schedulers import LedgerScheduler
from tests.conftest import connect_raw
from tests.integration.conftest import GRACE, claim

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def looked_at(monkeypatch) -> list[int]:
    """The ids of the tasks whose slot a pass recomputes (``slots.initial_run``), in order."""
    seen: list[int] = []
    initial_run = slots.initial_run

    def counting(task, *args, **kwargs):
        seen.append(task.pk)
        return initial_run(task, *args, **kwargs)

    monkeypatch.setattr(slots, "initial_run", counting)
    return seen


def _pending(tasks) -> dict[int, tuple[int, int]]:
    return {
        r.periodic_task_id: (r.scheduled_for.hour, r.scheduled_for.minute)
        for r in Run.objects.pending().filter(periodic_task__in=tasks)
    }


def _shared_crontab_tasks(make_task, n: int = 3) -> list[PeriodicTask]:
    return [make_task(cron="0 3 * * *") for _ in range(n)]


def _edit_by_save(crontab: CrontabSchedule) -> None:
    crontab.hour = "5"
    crontab.save()


def _edit_by_update(crontab: CrontabSchedule) -> None:
    CrontabSchedule.objects.filter(pk=crontab.pk).update(hour="5")


def _edit_by_raw_sql(crontab: CrontabSchedule) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_celery_beat_crontabschedule SET hour = %s WHERE id = %s",
            ["5", crontab.pk],
        )


@pytest.mark.parametrize("edit", [_edit_by_save, _edit_by_update, _edit_by_raw_sql])
def test_editing_a_shared_crontab_moves_every_task_using_it_within_one_tick(make_task, edit):
    tasks = _shared_crontab_tasks(make_task)
    other = make_task(cron="0 4 * * *")
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()
    assert set(_pending(tasks).values()) == {(3, 0)}
    old = list(Run.objects.pending().filter(periodic_task__in=tasks))

    edit(tasks[0].crontab)
    scheduler.tick()

    assert _pending(tasks) == {t.pk: (5, 0) for t in tasks}
    assert _pending([other]) == {other.pk: (4, 0)}
    assert list(
        Run.objects.filter(pk__in=[r.pk for r in old]).values_list("status", "reason")
    ) == [(Run.Status.CANCELLED, "schedule edited")] * 3


def test_queryset_update_of_a_task_is_caught(make_task):
    task = make_task(cron="0 3 * * *")
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()
    later = CrontabSchedule.objects.create(minute="30", hour="6", timezone="UTC")
    PeriodicTask.objects.filter(pk=task.pk).update(crontab=later)
    scheduler.tick()
    assert _pending([task]) == {task.pk: (6, 30)}


def test_queryset_update_of_a_shared_interval_moves_its_tasks(make_task):
    start = ledger.database_now() - timedelta(seconds=100)
    tasks = [make_task(every=3600, start_time=start) for _ in range(2)]
    ledger.reconcile(GRACE)
    assert {r.scheduled_for for r in Run.objects.pending()} == {start + timedelta(hours=1)}
    IntervalSchedule.objects.filter(pk=tasks[0].interval_id).update(every=1800)
    ledger.reconcile(GRACE)
    assert {r.scheduled_for for r in Run.objects.pending()} == {start + timedelta(minutes=30)}


def test_reconcile_looks_only_at_the_tasks_whose_definition_changed(make_task, looked_at):
    tasks = _shared_crontab_tasks(make_task, 2)
    for _ in range(40):
        make_task(cron="0 4 * * *")
    ledger.reconcile(GRACE)
    _edit_by_update(tasks[0].crontab)
    looked_at.clear()
    ledger.replan_edited("default")
    assert sorted(looked_at) == sorted(t.pk for t in tasks)


def test_a_write_that_changes_nothing_logs_nothing_and_moves_no_marker(make_task):
    task = make_task(cron="0 3 * * *")
    marker = PeriodicTasks.last_change()
    logged = list(ScheduleChange.objects.values_list("kind", "object_id"))
    assert logged == [(ScheduleChange.Kind.UNPLANNED, task.pk)]  # its creation
    CrontabSchedule.objects.filter(pk=task.crontab_id).update(hour="3")
    PeriodicTask.objects.filter(pk=task.pk).update(description="just a note")
    assert list(ScheduleChange.objects.values_list("kind", "object_id")) == logged
    assert PeriodicTasks.last_change() == marker


def test_dispatching_logs_no_change_and_triggers_no_reload(make_task, recorder):
    task = make_task(every=3600, start_time=ledger.database_now() - timedelta(seconds=1))
    ledger.reconcile(GRACE)
    marker = PeriodicTasks.last_change()
    assert [d.status for d in claim(recorder)] == [Run.Status.DISPATCHED]
    task.refresh_from_db()
    assert task.total_run_count == 1
    assert list(ScheduleChange.objects.values_list("kind", "object_id")) == [
        (ScheduleChange.Kind.UNPLANNED, task.pk)  # its creation only
    ]
    assert PeriodicTasks.last_change() == marker


def test_old_change_rows_are_pruned(make_task):
    task = make_task(cron="0 3 * * *")
    _edit_by_update(task.crontab)
    ScheduleChange.objects.update(changed_at=ledger.database_now() - timedelta(minutes=11))
    ledger.reconcile(GRACE)
    assert ScheduleChange.objects.count() == 0


def test_disabling_alone_logs_the_change_but_moves_no_marker(make_task):
    """The claim disables finished tasks in its own transaction: no marker lock there."""
    task = make_task(cron="0 3 * * *")
    marker = PeriodicTasks.last_change()
    PeriodicTask.objects.filter(pk=task.pk).update(enabled=False)
    assert PeriodicTasks.last_change() == marker
    assert list(
        ScheduleChange.objects.exclude(kind=ScheduleChange.Kind.UNPLANNED)
        .values_list("kind", "object_id")
    ) == [("task", task.pk)]
    PeriodicTask.objects.filter(pk=task.pk).update(enabled=True)
    assert PeriodicTasks.last_change() > marker


def test_an_edit_never_fires_a_slot_that_is_already_past_even_inside_the_grace(make_task):
    """The shared row now says a minute that began seconds ago: the next one is planned."""
    now = ledger.database_now()
    if now.second < 2 or now.second > 50:
        time.sleep(5)
        now = ledger.database_now()
    this_minute = now.replace(second=0, microsecond=0)
    tasks = _shared_crontab_tasks(make_task, 2)
    # saved long ago: the task's own edit time is no floor here, only the schedule row's edit
    PeriodicTask.objects.filter(pk__in=[t.pk for t in tasks]).update(
        date_changed=now - timedelta(days=2)
    )
    ledger.reconcile(GRACE)
    CrontabSchedule.objects.filter(pk=tasks[0].crontab_id).update(
        minute=str(this_minute.minute), hour=str(this_minute.hour)
    )
    ledger.reconcile(GRACE)
    assert set(Run.objects.pending().values_list("scheduled_for", flat=True)) == {
        this_minute + timedelta(days=1)
    }


def _old_plan_committed_after_the_edit(raw_connection, run_pk: int) -> None:
    """In ``raw_connection``'s open transaction, which locked run ``run_pk`` (a claim): dispatch
    it and plan the next slot from the definition it read (a day later, 03:00), then commit."""
    columns = [f.column for f in Run._meta.concrete_fields if f.column != "id"]
    values = [
        {"scheduled_for": "scheduled_for + interval '1 day'",
         "due_at": "due_at + interval '1 day'",
         "task_id": "task_id || '-next'",
         "status": "'pending'",
         "dispatched_at": "NULL"}.get(column, column)
        for column in columns
    ]
    raw_connection.execute(
        "UPDATE scheduling_run SET status = 'dispatched', dispatched_at = now() WHERE id = %s",
        [run_pk],
    )
    raw_connection.execute(
        f"INSERT INTO scheduling_run ({', '.join(columns)})"
        f" SELECT {', '.join(values)} FROM scheduling_run WHERE id = %s", [run_pk],
    )
    raw_connection.commit()


def test_a_change_settles_only_once_every_transaction_open_when_it_was_read_has_ended(
    make_task, raw_connection
):
    """A claim that read the old definition and commits its plan after the edit's passes: the
    change stays looked at until that claim ended, then its plan is moved, then it is settled."""
    task = make_task(cron="0 3 * * *")
    ledger.reconcile(GRACE)
    settled = ledger.SettledChanges()
    for _ in range(2):  # the creation's rows: read, then settled
        ledger.reconcile(GRACE, full=False, settled=settled)
    assert recent_changes("default", settled) == {}
    run = Run.objects.pending().get(periodic_task=task)
    assert run.scheduled_for.hour == 3

    raw_connection.execute("SELECT id FROM scheduling_run WHERE id = %s FOR UPDATE", [run.pk])
    _edit_by_update(task.crontab)
    change = ScheduleChange.objects.latest("id").pk
    ledger.reconcile(GRACE, full=False, settled=settled)  # the claimed run is skipped
    ledger.reconcile(GRACE, full=False, settled=settled)  # the claim is still open
    assert change not in settled.settled
    assert Run.objects.pending().get(periodic_task=task).pk == run.pk

    _old_plan_committed_after_the_edit(raw_connection, run.pk)
    assert Run.objects.pending().get(periodic_task=task).scheduled_for.hour == 3
    ledger.reconcile(GRACE, full=False, settled=settled)  # the last look: moves the old plan
    pending = Run.objects.pending().get(periodic_task=task)
    assert (pending.scheduled_for.hour, pending.scheduled_for.minute) == (5, 0)
    assert change in settled.settled
    assert recent_changes("default", settled) == {}
    # below the watermark: no longer read, nor remembered
    assert settled.since > ScheduleChange.objects.get(pk=change).changed_at
    assert (settled.settled, settled.first_seen) == (set(), {})


def test_a_bulk_change_is_checked_task_by_task_and_settles_the_same_way(
    make_task, raw_connection, monkeypatch, caplog
):
    """More unsettled rows than CHANGE_BATCH (one UPDATE of many tasks): a pass checks every task
    instead of the rows. A claim that read the old definition and commits its plan after those
    passes still has it moved; the rows settle once a check began after that claim ended, and
    later passes no longer read them."""
    monkeypatch.setattr(changes, "CHANGE_BATCH", 2)
    tasks = [make_task(cron="0 3 * * *") for _ in range(3)]
    ledger.reconcile(GRACE)
    settled = ledger.SettledChanges()
    for _ in range(3):  # the creations' rows: checked, checked again, settled
        ledger.reconcile(GRACE, full=False, settled=settled)
    assert recent_changes("default", settled) == {}
    run = Run.objects.pending().get(periodic_task=tasks[0])

    five = CrontabSchedule.objects.get_or_create(
        minute="0", hour="5", day_of_month="*", month_of_year="*", day_of_week="*",
        timezone="UTC",
    )[0]
    with connect_raw() as editing:
        editing.execute(
            "UPDATE django_celery_beat_periodictask SET crontab_id = %s WHERE id = ANY(%s)",
            [five.pk, [t.pk for t in tasks]],
        )  # the edit's transaction starts first: its rows are older than the claim
        raw_connection.execute(
            "SELECT id FROM scheduling_run WHERE id = %s FOR UPDATE", [run.pk]
        )  # a claim reading the old definition
        editing.commit()
    caplog.clear()
    ledger.reconcile(GRACE, full=False, settled=settled)  # the claimed run is skipped
    assert caplog.messages.count("more than 2 changes to look at: checking every task") == 1
    assert _pending(tasks) == {tasks[0].pk: (3, 0), tasks[1].pk: (5, 0), tasks[2].pk: (5, 0)}
    ledger.reconcile(GRACE, full=False, settled=settled)  # the claim is still open
    assert recent_changes("default", settled) is None

    _old_plan_committed_after_the_edit(raw_connection, run.pk)
    ledger.reconcile(GRACE, full=False, settled=settled)  # moves the old plan; settles the rows
    assert _pending(tasks) == {t.pk: (5, 0) for t in tasks}
    assert recent_changes("default", settled) == {}
    assert settled.since > ScheduleChange.objects.latest("id").changed_at


def test_a_pass_leaves_settled_changes_out(make_task, looked_at, monkeypatch):
    """Each pass reads the change log less what it settled; a run already planned from its
    task's current definition (``definition_version``) has no slot recomputed."""
    tasks = [make_task(cron="0 3 * * *") for _ in range(3)]
    ledger.reconcile(GRACE)
    settled = ledger.SettledChanges()
    read: list[dict[str, set[int]]] = []

    def reading(using, settled=None):
        changed = recent_changes(using, settled)
        read.append({kind: set(ids) for kind, ids in changed.items()})
        return changed

    monkeypatch.setattr(importlib.import_module("scheduling.ledger.reconcile"), "recent_changes",
                        reading)
    for task in tasks:
        task.crontab = CrontabSchedule.objects.get_or_create(
            minute="0", hour="6", day_of_month="*", month_of_year="*", day_of_week="*",
            timezone="UTC",
        )[0]
        task.save()
    ids = {t.pk for t in tasks}
    read.clear()
    looked_at.clear()
    ledger.reconcile(GRACE, full=False, settled=settled)  # re-plans the three
    assert Counter(looked_at) == {t.pk: 1 for t in tasks}
    looked_at.clear()
    ledger.reconcile(GRACE, full=False, settled=settled)  # nothing open: the last look
    assert looked_at == []  # their runs carry the current definition version
    assert [changed.get("task", set()) & ids for changed in read] == [ids, ids]
    read.clear()
    ledger.reconcile(GRACE, full=False, settled=settled)
    assert read == [{}]
    assert looked_at == []
    tasks[0].crontab = tasks[1].crontab = CrontabSchedule.objects.get_or_create(
        minute="0", hour="7", day_of_month="*", month_of_year="*", day_of_week="*",
        timezone="UTC",
    )[0]
    tasks[0].save()
    read.clear()
    ledger.reconcile(GRACE, full=False, settled=settled)
    assert read == [{"task": {tasks[0].pk}}]
    assert looked_at == [tasks[0].pk]
    hours = {r.periodic_task_id: r.scheduled_for.hour for r in Run.objects.pending()}
    assert hours == {tasks[0].pk: 7, tasks[1].pk: 6, tasks[2].pk: 6}
