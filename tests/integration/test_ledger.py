"""Ledger behaviour on real PostgreSQL: planning rules, bad input, manual runs, reconcile."""

from __future__ import annotations

import importlib
from collections import Counter
from datetime import timedelta

import pytest
from django_celery_beat.models import ClockedSchedule, PeriodicTask, SolarSchedule

from scheduling import ledger, slots
from scheduling.models import Run
from tests.integration.conftest import GRACE, claim

HOUR = timedelta(hours=1)

pytestmark = pytest.mark.django_db(transaction=True)


def test_c10_crontab_with_start_time_first_runs_at_its_slot_not_at_startup(make_task):
    """C10: crontab M H, start_time two minutes ago, replicas start now: first run at H:M."""
    now = ledger.database_now()
    target = (now + timedelta(minutes=3)).replace(second=0, microsecond=0)
    task = make_task(
        cron=f"{target.minute} {target.hour} * * *", start_time=now - timedelta(minutes=2)
    )
    ledger.reconcile(GRACE)
    assert list(Run.objects.values_list("periodic_task_id", "scheduled_for", "status")) == [
        (task.pk, target, Run.Status.PENDING)
    ]


def test_c07_two_one_offs_sharing_a_clocked_row_each_run_once(make_task, recorder):
    clocked = ClockedSchedule.objects.create(
        clocked_time=ledger.database_now() - timedelta(seconds=1)
    )
    first, second = make_task(clocked=clocked), make_task(clocked=clocked)
    ledger.reconcile(GRACE)
    claim(recorder)
    claim(recorder)
    ledger.reconcile(GRACE)
    claim(recorder)

    runs = list(Run.objects.order_by("periodic_task_id").values_list(
        "periodic_task_id", "scheduled_for", "status"))
    assert runs == [
        (first.pk, clocked.clocked_time, Run.Status.DISPATCHED),
        (second.pk, clocked.clocked_time, Run.Status.DISPATCHED),
    ]
    assert sorted(recorder.task_ids) == sorted(
        slots.task_id_for(t.pk, clocked.clocked_time) for t in (first, second)
    )
    assert list(PeriodicTask.objects.filter(pk__in=[first.pk, second.pk])
                .values_list("enabled", flat=True)) == [False, False]


def test_disabled_and_deleted_tasks_have_their_pending_runs_cancelled(make_task):
    kept, disabled, deleted = make_task(every=30), make_task(every=30), make_task(every=30)
    ledger.reconcile(GRACE)
    disabled.enabled = False
    disabled.save()
    deleted_name = deleted.name
    deleted.delete()
    ledger.reconcile(GRACE)

    assert Run.objects.pending().get().periodic_task_id == kept.pk
    cancelled = dict(Run.objects.filter(status=Run.Status.CANCELLED)
                     .values_list("periodic_task_name", "reason"))
    assert cancelled == {
        disabled.name: "periodic task disabled",
        deleted_name: "periodic task deleted",
    }



def test_a_pass_cancels_a_bounded_number_of_orphaned_runs(make_task, monkeypatch):
    """ORPHAN_BATCH runs a transaction, ORPHAN_BATCHES_PER_PASS transactions a pass: disabling
    a million tasks at once no longer makes one pass lock a million runs (the benchmark's
    correctness scenario after its million-task scenario: every replica stalled on it)."""
    module = importlib.import_module("scheduling.ledger.reconcile")  # the package's name is
    # the function's

    monkeypatch.setattr(module, "ORPHAN_BATCH", 2)
    monkeypatch.setattr(module, "ORPHAN_BATCHES_PER_PASS", 3)
    tasks = [make_task(every=3600) for _ in range(11)]
    ledger.reconcile(GRACE)
    PeriodicTask.objects.filter(pk__in=[t.pk for t in tasks[:9]]).update(enabled=False)
    tasks[9].delete()

    def cancelled() -> dict[str, int]:
        return dict(Counter(Run.objects.filter(status=Run.Status.CANCELLED)
                            .values_list("reason", flat=True)))

    ledger.reconcile(GRACE)  # a full pass: 3 transactions of 2
    assert sum(cancelled().values()) == 6
    ledger.reconcile(GRACE)  # the last 4
    assert cancelled() == {"periodic task disabled": 9, "periodic task deleted": 1}
    assert list(Run.objects.pending().values_list("periodic_task_id", flat=True)) == [tasks[10].pk]

def test_edit_replans_a_pending_run_from_the_new_definition(make_task):
    task = make_task(cron="0 3 * * *")
    ledger.reconcile(GRACE)
    old = Run.objects.pending().get()
    task.crontab = type(task.crontab).objects.create(minute="30", hour="4", timezone="UTC")
    task.save()
    ledger.reconcile(GRACE)

    new = Run.objects.pending().get()
    assert (new.scheduled_for.hour, new.scheduled_for.minute) == (4, 30)
    old.refresh_from_db()
    assert (old.status, old.reason) == (Run.Status.CANCELLED, "schedule edited")


def test_manual_run_is_dispatched_once_and_leaves_the_schedule_alone(make_task, recorder):
    task = make_task(every=3600)
    ledger.reconcile(GRACE)
    scheduled = Run.objects.pending().get()
    manual = ledger.request_run(task, requested_by="alice")

    claim(recorder)
    claim(recorder)

    manual.refresh_from_db()
    assert (manual.trigger, manual.status, manual.requested_by) == ("manual", "dispatched", "alice")
    assert recorder.task_ids == [manual.task_id]
    assert Run.objects.pending().get() == scheduled
    task.refresh_from_db()
    assert task.total_run_count == 0


def test_solar_task_is_planned_at_its_next_event_on_a_whole_second():
    solar = SolarSchedule.objects.create(event="sunset", latitude=52.52, longitude=13.40)
    task = PeriodicTask.objects.create(name="sunset", task="project.tasks.record", solar=solar)
    ledger.reconcile(GRACE)
    run = Run.objects.pending().get(periodic_task=task)
    now = ledger.database_now()
    # any replica, planning at any moment before the event (after the one before), computes the
    # same slot (not "an hour before now": within the hour after a sunset that is the last one)
    assert run.scheduled_for == slots.next_run(task, now)
    assert slots.next_run(task, run.scheduled_for - HOUR) == run.scheduled_for
    assert run.scheduled_for.microsecond == 0
    assert now < run.scheduled_for < now + timedelta(hours=24, minutes=5)
    assert run.task_id == slots.task_id_for(task.pk, run.scheduled_for)
