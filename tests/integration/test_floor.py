"""The due floor (``ledger.DueFloor``): the poll and the claim skip the index entries of runs
claimed while a long transaction held vacuum back, and still find every run."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.db import connection

from scheduling import ledger, slots
from scheduling.ledger import floor as due_floor
from scheduling.models import Run
from scheduling.sql import queries
from tests.integration.conftest import GRACE, claim

pytestmark = pytest.mark.django_db(transaction=True)


def _pending(task, due, trigger=Run.Trigger.BACKFILL) -> Run:
    return Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=due,
        due_at=due, trigger=trigger, task_id=str(uuid.uuid4()),
    )


def test_a_full_poll_sets_the_floor_at_the_earliest_due_run_or_its_clock():
    now = ledger.database_now()
    seconds = [0.0]
    floor = ledger.DueFloor(clock=lambda: seconds[0])
    assert floor.value is None
    floor.seen(now, now - timedelta(seconds=30), full=False)
    assert floor.value is None  # only a poll from no floor sets it
    floor.seen(now, now - timedelta(seconds=30), full=True)
    assert floor.value == now - timedelta(seconds=30)
    floor.seen(now, now + timedelta(hours=1), full=True)
    assert floor.value == now  # never above the clock: a run-now is due from now on
    floor.seen(now, None, full=True)
    assert floor.value == now
    seconds[0] = due_floor.REFRESH - 0.01
    assert floor.value == now
    seconds[0] = due_floor.REFRESH
    assert floor.value is None  # held for REFRESH seconds
    floor.seen(now, None, full=True)
    floor.drop()
    assert floor.value is None


def test_the_poll_and_the_claim_see_nothing_due_below_the_floor(make_task, recorder):
    task = make_task(every=3600, start_time=ledger.database_now() + timedelta(hours=1))
    now = ledger.database_now()
    old = _pending(task, now - timedelta(minutes=10))
    recent = _pending(task, now - timedelta(seconds=5))
    floor = now - timedelta(minutes=1)

    assert ledger.poll().next_due == old.due_at
    assert ledger.poll(floor=floor).next_due == recent.due_at
    claimed = ledger.claim_and_dispatch(
        recorder, replica_id="test:1", batch_size=100, grace=GRACE, floor=floor
    )
    assert [d.task_id for d in claimed] == [recent.task_id]
    assert [d.task_id for d in claim(recorder)] == [old.task_id]  # no floor: every due run


def test_a_run_planned_below_the_floor_is_dispatched_once_the_floor_is_refreshed(make_task):
    """A backfill due in the past, created after the replica's full poll: found at the next."""
    from project.celery import app
    from scheduling.schedulers import LedgerScheduler

    task = make_task(every=3600, start_time=ledger.database_now() + timedelta(hours=1))
    seconds = [0.0]
    scheduler = LedgerScheduler(app=app)
    scheduler._floor = ledger.DueFloor(clock=lambda: seconds[0])
    scheduler.tick()  # plans the task's first run, an hour ahead; the floor is set
    assert scheduler._floor.value is not None
    backfill = _pending(task, ledger.database_now() - timedelta(minutes=5))

    scheduler.tick()
    assert Run.objects.get(pk=backfill.pk).status == Run.Status.PENDING
    seconds[0] = due_floor.REFRESH
    scheduler.tick()  # the floor has expired: this poll reads the whole index
    scheduler.tick()
    assert Run.objects.get(pk=backfill.pk).status == Run.Status.DISPATCHED


def _buffers(floor) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries["poll"],
            [floor or ledger.NO_FLOOR],
        )
        (result,) = cursor.fetchone()
    plan = json.loads(result) if isinstance(result, str) else result
    return int(plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"])


def test_with_vacuum_held_back_the_floor_skips_the_claimed_runs_entries(
    make_task, recorder, raw_connection
):
    """2,000 runs claimed while another session's snapshot is open: their entries stay in the
    pending index; a poll from no floor reads past every one, a poll from the floor does not."""
    task = make_task(every=3600, start_time=ledger.database_now() + timedelta(hours=1))
    raw_connection.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    raw_connection.execute("SELECT count(*) FROM scheduling_run").fetchone()  # the snapshot
    try:
        now = ledger.database_now()
        Run.objects.bulk_create([
            Run(periodic_task=task, periodic_task_name=task.name, task=task.task,
                scheduled_for=now - timedelta(seconds=i), due_at=now - timedelta(seconds=i),
                trigger=Run.Trigger.BACKFILL, task_id=slots.task_id_for(task.pk, now) + str(i))
            for i in range(1, 2001)
        ])
        while claim(recorder, batch_size=500):
            pass
        assert len(recorder.messages) == 2000
        poll = ledger.poll()
        floor = ledger.DueFloor()
        floor.seen(poll.now, poll.next_due, full=True)
        full, from_floor = _buffers(None), _buffers(floor.value)
    finally:
        raw_connection.execute("ROLLBACK")
    # 2,000 dead entries and the heap pages of their row versions (64 buffers when written)
    # against the floor's first entry and the change marker's row (4 buffers)
    assert (from_floor <= 5, full >= 40) == (True, True), (from_floor, full)
