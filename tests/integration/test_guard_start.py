"""The guard's one-statement start, the SQL function ``scheduling_start_execution``, performs the
verdict's case "first delivery" and no other, on real PostgreSQL.

A run is put in every status (with reason "", "not delivered" or "worker lost", and 0 or 1
executions) at attempt 1, and the function is called for a delivery of attempt 0, 1 and 2 on a
session of its own, the execution lock free, then held by another session. It starts the run
exactly where ``verdict.verdict`` answers ``FIRST_DELIVERY`` for that delivery (whatever the
broker's flag and the worker-loss policy, which the function does not read), and what it writes
is that case's one write, ``Write.START``; everywhere else the row is left as it was.
"""

from __future__ import annotations

import itertools

import psycopg
import pytest

from scheduling import ledger
from scheduling.ledger.verdict import FIRST_DELIVERY, LOCK_HELD, Case, RunFacts, Write, verdict
from scheduling.models import Run, TaskPolicy
from tests.conftest import connect_raw

pytestmark = pytest.mark.django_db(transaction=True)

START = "SELECT mine, run_id FROM scheduling_start_execution(%s, %s, %s)"
LOCK = "SELECT pg_advisory_lock(scheduling_execution_lock_key(%s, %s))"
#: The run's attempt: deliveries of attempt 0, 1 and 2 are an earlier, the same and a later one.
ATTEMPT = 1
STATES = list(itertools.product(
    Run.Status.values, ("", Run.Reason.NOT_DELIVERED, Run.Reason.WORKER_LOST), (0, 1)
))


def cases(state: tuple[str, str, int], retries: int, *, exclusive: bool) -> set[Case]:
    """The verdict's cases for a delivery of ``retries`` on a run in ``state``, over both values
    of what the SQL function does not read (the broker's flag, the policy)."""
    status, reason, executions = state
    return {
        verdict(
            RunFacts(status, reason, executions, ATTEMPT, policy), retries=retries,
            redelivered=redelivered, exclusive=exclusive, ahead_of_ledger=False,
        ).case
        for policy, redelivered in itertools.product(TaskPolicy.WorkerLost.values, (False, True))
    }


def put(run: Run, state: tuple[str, str, int]) -> dict[str, object]:
    """Put ``run`` in ``state`` at attempt ``ATTEMPT``, never started; return its row. Through
    pending, a status no trigger acts on leaving (a run leaving running for buffered would be
    released by the buffer trigger)."""
    status, reason, executions = state
    rows = Run.objects.filter(pk=run.pk)
    rows.update(status=Run.Status.PENDING)
    rows.update(
        status=status, reason=reason, executions=executions, retries=ATTEMPT, worker="",
        started_at=None,
    )
    row = rows.values().get()
    assert (row["status"], row["reason"], row["executions"]) == state
    return row


@pytest.fixture
def sessions():
    """The worker's session (autocommit) and another session, to hold a lock."""
    worker, other = connect_raw(), connect_raw()
    worker.autocommit = other.autocommit = True
    try:
        yield worker, other
    finally:
        worker.close()
        other.close()


def start(worker: psycopg.Connection, task_id: str, retries: int) -> tuple[bool, bool]:
    """Call the function; return (lock taken, run started), the session's locks released."""
    mine, run_id = worker.execute(START, [task_id, retries, "w1@host"]).fetchone()
    worker.execute("SELECT pg_advisory_unlock_all()")
    return mine, run_id is not None


def test_it_starts_a_run_exactly_where_the_verdict_is_first_delivery(make_task, sessions):
    assert FIRST_DELIVERY.writes == (Write.START,)
    worker, _ = sessions
    run = ledger.request_run(make_task(every=3600))
    started, wrong = [], []
    for state, retries in itertools.product(STATES, (0, 1, 2)):
        before = put(run, state)
        mine, did = start(worker, run.task_id, retries)
        after = Run.objects.filter(pk=run.pk).values().get()
        found = cases(state, retries, exclusive=True)
        first = FIRST_DELIVERY in found
        if did:
            started.append((state, retries))
            assert after["started_at"] is not None
            before |= {"status": Run.Status.RUNNING, "started_at": after["started_at"],
                       "worker": "w1@host", "retries": retries,
                       "executions": before["executions"] + 1}
        if not mine or did != first or (first and found != {FIRST_DELIVERY}) or after != before:
            wrong.append((state, retries, mine, did))
    assert wrong == []
    assert started == [
        ((Run.Status.DISPATCHED, reason, executions), retries)
        for reason, executions in itertools.product(
            ("", Run.Reason.NOT_DELIVERED, Run.Reason.WORKER_LOST), (0, 1)
        )
        for retries in (0, 1, 2)
    ]


def test_it_starts_nothing_while_another_session_holds_the_lock(make_task, sessions):
    worker, other = sessions
    run = ledger.request_run(make_task(every=3600))
    wrong = []
    for state, retries in itertools.product(STATES, (0, 1, 2)):
        before = put(run, state)
        other.execute(LOCK, [run.task_id, retries])
        result = start(worker, run.task_id, retries)
        other.execute("SELECT pg_advisory_unlock_all()")
        unchanged = Run.objects.filter(pk=run.pk).values().get() == before
        if result != (False, False) or not unchanged or cases(
            state, retries, exclusive=False
        ) != {LOCK_HELD}:
            wrong.append((state, retries, result, unchanged))
    assert wrong == []


def test_it_starts_nothing_without_a_run(sessions):
    worker, _ = sessions
    assert start(worker, "no-run-has-this-id", 0) == (True, False)
    assert FIRST_DELIVERY not in {
        verdict(None, retries=0, redelivered=redelivered, exclusive=True,
                ahead_of_ledger=ahead).case
        for redelivered, ahead in itertools.product((False, True), (False, True))
    }
