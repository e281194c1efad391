"""Rows Django cannot load, or absurd ones, fail their own run and stop nothing else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from scheduling import ledger, slots
from scheduling.models import Run
from tests.integration.conftest import GRACE, claim, make_due

pytestmark = pytest.mark.django_db(transaction=True)



def test_an_unknown_time_zone_written_by_sql_fails_only_its_own_run(make_task, recorder):
    good = make_task(every=60, start_time=ledger.database_now() - timedelta(seconds=1))
    bad = make_task(cron="* * * * *")
    good_run, bad_run = make_due(good), make_due(bad)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_celery_beat_crontabschedule SET timezone = 'Mars/Olympus' WHERE id = %s",
            [bad.crontab_id],
        )

    claim(recorder)

    assert recorder.task_ids == [good_run.task_id]
    bad_run.refresh_from_db()
    assert (bad_run.status, bad_run.reason) == (Run.Status.FAILED, "invalid schedule")
    assert "Mars/Olympus" in bad_run.error
    assert Run.objects.pending().filter(periodic_task=good).count() == 1

    # Planning goes on for the others, and records the bad task's error once.
    ledger.reconcile(GRACE)
    ledger.reconcile(GRACE)
    failed_plans = Run.objects.filter(periodic_task=bad, error__startswith="cannot load the schedule")
    assert failed_plans.count() == 1


def test_a_run_due_since_1900_is_coalesced_without_stopping_the_batch(make_task, recorder):
    """A 1 s interval three billion slots late: its count is capped, the batch goes on."""
    good = make_task(every=60, start_time=ledger.database_now() - timedelta(seconds=1))
    slot = datetime(1900, 1, 1, tzinfo=UTC)
    ancient = make_task(every=1, start_time=slot)
    good_run = make_due(good)
    Run.objects.filter(periodic_task=ancient, status=Run.Status.PENDING).update(
        scheduled_for=slot, task_id=slots.task_id_for(ancient.pk, slot)
    )

    claim(recorder)

    old = Run.objects.get(periodic_task=ancient, scheduled_for=slot)
    assert (old.status, old.slots) == (Run.Status.DISPATCHED, slots.MAX_COUNTED_SLOTS + 1)
    assert sorted(recorder.task_ids) == sorted([good_run.task_id, old.task_id])
    following = Run.objects.pending().get(periodic_task=ancient).scheduled_for
    assert timedelta(0) < following - ledger.database_now() <= timedelta(seconds=1)
