"""Switching a deployment from stock DatabaseScheduler to LedgerScheduler (issue 3)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django_celery_beat.models import PeriodicTask

from scheduling import ledger, slots
from scheduling.models import Run
from tests.integration.conftest import GRACE, claim

pytestmark = pytest.mark.django_db(transaction=True)


def _as_stock_beat_left_it(task: PeriodicTask, last_run_at, runs: int) -> PeriodicTask:
    """Write last_run_at/total_run_count the way stock beat's sync does: a full save()."""
    task.last_run_at = last_run_at
    task.total_run_count = runs
    task.save()
    task.refresh_from_db()
    return task


def test_interval_task_run_by_stock_beat_3_s_ago_runs_next_one_interval_later(make_task, recorder):
    now = ledger.database_now()
    task = _as_stock_beat_left_it(make_task(every=10), now - timedelta(seconds=3), runs=7)
    ledger.reconcile(GRACE)

    run = Run.objects.pending().get(periodic_task=task)
    # the task's grid (anchored one interval after its last save) at or after last_run_at + 10 s
    assert run.scheduled_for == task.date_changed + timedelta(seconds=10)
    assert run.scheduled_for >= task.last_run_at + timedelta(seconds=10)

    Run.objects.filter(pk=run.pk).update(scheduled_for=ledger.database_now())  # due now
    claim(recorder)
    task.refresh_from_db()
    assert task.total_run_count == 8
    assert len(recorder.messages) == 1


def test_crontab_slot_missed_at_the_switch_is_coalesced_not_lost(make_task, recorder):
    now = ledger.database_now()
    if now.second >= 55:  # keep the whole test inside one minute
        time.sleep(61 - now.second)
        now = ledger.database_now()
    minute = now.replace(second=0, microsecond=0)
    # stock beat sent the run of minute-3 and stopped; the ledger starts now
    task = _as_stock_beat_left_it(
        make_task(cron="* * * * *"), minute - timedelta(minutes=3, milliseconds=-300), runs=41
    )
    PeriodicTask.objects.filter(pk=task.pk).update(
        date_changed=minute - timedelta(minutes=3, milliseconds=-500)
    )
    ledger.reconcile(GRACE)
    first = Run.objects.pending().get(periodic_task=task)
    assert first.scheduled_for == minute - timedelta(minutes=2)

    claim(recorder)
    first.refresh_from_db()
    assert (first.status, first.slots) == (Run.Status.DISPATCHED, 3)  # minute-2 .. minute
    assert recorder.task_ids == [slots.task_id_for(task.pk, minute - timedelta(minutes=2))]
    assert Run.objects.pending().get(periodic_task=task).scheduled_for == minute + timedelta(
        minutes=1
    )
    task.refresh_from_db()
    assert task.total_run_count == 42


def test_clocked_one_off_stock_beat_already_sent_is_not_sent_again(make_task, recorder):
    # Stock beat 2.9 sent it at its clocked time and stopped before its next tick (which disables
    # a one-off whose total_run_count is above 0): enabled, last_run_at and the count are left.
    clocked_at = ledger.database_now() - timedelta(seconds=30)
    task = _as_stock_beat_left_it(
        make_task(clocked=clocked_at), clocked_at + timedelta(milliseconds=300), runs=1
    )
    assert task.enabled

    ledger.reconcile(GRACE)
    claim(recorder)
    ledger.reconcile(GRACE)
    claim(recorder)

    assert recorder.messages == []
    assert not Run.objects.filter(periodic_task=task).exists()
    task.refresh_from_db()
    assert (task.enabled, task.total_run_count) == (False, 1)


def test_clocked_one_off_stock_beat_never_sent_is_sent_once_at_its_time(make_task, recorder):
    # Stock beat ran the deployment (other tasks ran) but this one-off's time had not come.
    clocked_at = ledger.database_now() + timedelta(seconds=2)
    task = make_task(clocked=clocked_at)
    assert (task.last_run_at, task.total_run_count) == (None, 0)

    ledger.reconcile(GRACE)
    run = Run.objects.pending().get(periodic_task=task)
    assert run.scheduled_for == clocked_at
    claim(recorder)
    assert recorder.messages == []  # not before its time

    time.sleep(max(0.0, (clocked_at - ledger.database_now()).total_seconds()) + 0.2)
    claim(recorder)
    ledger.reconcile(GRACE)
    claim(recorder)

    assert recorder.task_ids == [slots.task_id_for(task.pk, clocked_at)]
    run.refresh_from_db()
    assert run.status == Run.Status.DISPATCHED
    assert Run.objects.filter(periodic_task=task).count() == 1
    task.refresh_from_db()
    assert (task.enabled, task.total_run_count) == (False, 1)
