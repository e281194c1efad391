"""Stable jitter in the ledger: runs keep their slot and task id, are claimed at ``due_at``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from scheduling import ledger, slots
from scheduling.models import Run, TaskPolicy
from scheduling.sql import queries
from tests.integration.conftest import GRACE, claim

pytestmark = pytest.mark.django_db(transaction=True)


def _jittered(make_task, jitter: int = 30, every: int = 600):
    task = make_task(every=every)
    TaskPolicy.objects.create(periodic_task=task, jitter_seconds=jitter)
    ledger.reconcile(GRACE)
    return task, Run.objects.pending().get(periodic_task=task)


def _move(run: Run, slot_ago: float, due_in: float) -> Run:
    """Put ``run``'s slot ``slot_ago`` s in the past and its due moment ``due_in`` s from now."""
    now = ledger.database_now()
    slot = now - timedelta(seconds=slot_ago)
    Run.objects.filter(pk=run.pk).update(
        scheduled_for=slot, due_at=now + timedelta(seconds=due_in),
        task_id=slots.task_id_for(run.periodic_task_id, slot),
    )
    return Run.objects.get(pk=run.pk)


def test_a_planned_run_keeps_its_slot_and_gains_its_due_moment(make_task):
    task, run = _jittered(make_task)
    assert run.due_at == slots.due_moment(task, run.scheduled_for, 30)
    assert timedelta(0) < run.due_at - run.scheduled_for < timedelta(seconds=30)
    assert run.task_id == slots.task_id_for(task.pk, run.scheduled_for)


def test_the_claim_waits_for_the_due_moment_and_measures_lateness_from_it(make_task, recorder):
    task, run = _jittered(make_task)
    run = _move(run, slot_ago=10, due_in=20)
    assert claim(recorder) == []  # its slot passed, its due moment has not
    assert ledger.poll().next_due == run.due_at

    run = _move(run, slot_ago=10, due_in=-0.5)
    (done,) = claim(recorder)
    run.refresh_from_db()
    assert recorder.task_ids == [slots.task_id_for(task.pk, run.scheduled_for)]
    assert done.lateness == (run.dispatched_at - run.due_at).total_seconds()
    assert 0.5 <= done.lateness < 10  # from the due moment, not the slot 10 s ago
    following = Run.objects.pending().get(periodic_task=task)
    assert following.scheduled_for == slots.next_run(task, run.scheduled_for)
    assert following.due_at == slots.due_moment(task, following.scheduled_for, 30)


def test_a_run_due_inside_its_grace_is_no_misfire_however_old_its_slot(make_task, recorder):
    _, run = _jittered(make_task, jitter=3600, every=7200)
    run = _move(run, slot_ago=GRACE.total_seconds() + 30, due_in=-1)
    (done,) = claim(recorder)
    assert (done.status, done.misfire, done.reason) == (Run.Status.DISPATCHED, "", "")
    assert Run.objects.get(pk=run.pk).slots == 1


def test_runs_written_without_a_due_moment_get_their_slot(make_task):
    task = make_task(every=3600)
    now = ledger.database_now()
    run = Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=now,
        task_id="raw-1",
    )
    run.refresh_from_db()
    assert run.due_at == now
    Run.objects.filter(pk=run.pk).update(scheduled_for=now + timedelta(seconds=5))
    run.refresh_from_db()
    assert run.due_at == now + timedelta(seconds=5)  # a hand-moved run is due at its slot
    run.due_at = None
    run.save()  # a stale copy without it keeps the row's due moment
    run.refresh_from_db()
    assert run.due_at == now + timedelta(seconds=5)


def test_the_claim_reads_the_pending_index_in_due_order(make_task):
    for _ in range(5):
        _jittered(make_task)
    # the generic plan, as a replica's session runs the prepared claim (plan_cache_mode)
    statement = queries["claim"].replace("%(floor)s", "$1").replace("%(limit)s", "$2")
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_bitmapscan = off")
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute("PREPARE claim_plan(timestamptz, bigint) AS " + statement)
        cursor.execute("EXPLAIN EXECUTE claim_plan(%s, 100)", [ledger.NO_FLOOR])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE claim_plan")
        cursor.execute("RESET enable_seqscan")
        cursor.execute("RESET enable_bitmapscan")
        cursor.execute("RESET plan_cache_mode")
    assert "Index Scan using scheduling_run_pending_due on scheduling_run r" in plan
    # Both ends are index conditions: the replica's due floor (ledger.DueFloor) and the clock.
    (cond,) = [line.strip() for line in plan.splitlines() if "Index Cond: ((due_at" in line]
    assert cond == "Index Cond: ((due_at >= $1) AND (due_at <= statement_timestamp()))"
    assert "Sort" not in plan.split("SubPlan")[0]  # the index is in the claim's order
