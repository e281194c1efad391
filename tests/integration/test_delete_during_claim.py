"""Deleting a periodic task while a replica's claim of its run is in flight (two connections)."""

from __future__ import annotations

import pytest
from django.db import connection

from scheduling import ledger
from scheduling.models import Run
from tests.integration.conftest import GRACE, claim_in_flight, make_due

pytestmark = pytest.mark.django_db(transaction=True)


def _run_locked(run_id: int) -> bool:
    """Whether another session holds a row lock on the run (the claim)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT NOT EXISTS (SELECT 1 FROM scheduling_run WHERE id = %s FOR UPDATE SKIP LOCKED)",
            [run_id],
        )
        return cursor.fetchone()[0]


def test_a_task_deleted_while_its_run_is_being_claimed_is_deleted_at_the_first_try(make_task):
    task = make_task(every=3600, name="short-lived")
    run = make_due(task)
    with claim_in_flight(replica_id="replica-1") as claiming:
        assert claiming.task_ids == [run.task_id]  # published; the claim is open
        assert _run_locked(run.pk)
        task.delete()  # waits for the claim on the run row, then must succeed at once

    assert [d.status for d in claiming.outcome] == [Run.Status.DISPATCHED]  # it committed
    run.refresh_from_db()
    assert (run.status, run.periodic_task_id, run.periodic_task_name) == (
        Run.Status.DISPATCHED, None, "short-lived"
    )
    # the run the claim planned for the deleted task is detached too, and then cancelled
    following = Run.objects.get(status=Run.Status.PENDING)
    assert (following.periodic_task_id, following.periodic_task_name) == (None, "short-lived")
    ledger.reconcile(GRACE)
    following.refresh_from_db()
    assert (following.status, following.reason) == (Run.Status.CANCELLED, "periodic task deleted")


def test_the_run_to_task_foreign_key_sets_null_in_the_database():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT confdeltype, condeferrable, condeferred FROM pg_constraint"
            " WHERE conrelid = 'scheduling_run'::regclass AND contype = 'f'"
            " AND confrelid = 'django_celery_beat_periodictask'::regclass"
        )
        assert cursor.fetchall() == [("n", True, True)]  # SET NULL, deferrable, deferred
