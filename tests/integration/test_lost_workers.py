"""The reconcile pass closes a running run whose worker is gone: its execution lock stayed free.

The lock is the guard's (``scheduling.guard``): a session-level advisory lock on (task id,
``retries``) held by the executing process's own session. Here a second connection plays that
process: holding the lock is a live worker, closing the connection is its death.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import GRACE, claim

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(make_task, recorder) -> Run:
    """A manual run that the guard started (``executions`` 1), no lock held by anyone."""
    run = ledger.request_run(make_task(every=3600))
    claim(recorder)
    decision = ledger.begin_execution(
        run.task_id, "w1@host", retries=0, redelivered=False, exclusive=True
    )
    assert decision.execute
    run.refresh_from_db()
    assert (run.status, run.executions) == (Run.Status.RUNNING, 1)
    return run


def recover(run: Run) -> None:
    """Give the run's task worker-loss policy recover."""
    TaskPolicy.objects.create(
        periodic_task=run.periodic_task, worker_lost_policy=TaskPolicy.WorkerLost.RECOVER
    )


def hold_lock(conn: psycopg.Connection, run: Run, retries: int = 0) -> None:
    conn.execute(
        "SELECT pg_advisory_lock(scheduling_execution_lock_key(%s, %s))", [run.task_id, retries]
    )
    conn.commit()


def die(conn: psycopg.Connection) -> None:
    """Close ``conn`` as a dying worker does, and wait until the server has ended its session
    (the backend exits a moment after the client is gone, and only then frees the locks)."""
    pid = conn.info.backend_pid
    conn.close()
    deadline = time.monotonic() + 10
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.02)
    raise AssertionError(f"backend {pid} still there 10 s after its client closed")


def status(run: Run) -> tuple[str, str]:
    run.refresh_from_db()
    return run.status, run.reason


def test_a_run_whose_lock_is_held_is_never_closed(running, raw_connection):
    hold_lock(raw_connection, running)
    lost = ledger.LostExecutions(after=0)
    assert ledger.close_lost_executions(lost) == []
    assert ledger.close_lost_executions(lost) == []
    assert status(running) == (Run.Status.RUNNING, "")
    assert lost.first_seen == {}


def test_a_lock_held_for_another_attempt_does_not_count(running, raw_connection):
    hold_lock(raw_connection, running, retries=1)
    assert ledger.close_lost_executions(ledger.LostExecutions(after=0)) == [running.task_id]


def test_a_run_is_closed_only_after_its_lock_stayed_free_for_the_bound(running, raw_connection):
    hold_lock(raw_connection, running)
    lost = ledger.LostExecutions(after=0.5)
    assert ledger.close_lost_executions(lost) == []
    die(raw_connection)  # the worker dies: the server frees its lock
    assert ledger.close_lost_executions(lost) == []  # first seen free now
    assert list(lost.first_seen) == [(running.pk, 1)]
    time.sleep(0.6)
    assert ledger.close_lost_executions(lost) == [running.task_id]
    run = Run.objects.get(pk=running.pk)
    assert (run.status, run.reason, run.executions) == (Run.Status.FAILED, "worker lost", 1)
    assert run.error == (
        "the worker running it died mid-run (its execution lock was free for 0.5 s or more, or "
        "its database session ended); worker-loss policy fail: not run again"
    )
    assert run.finished_at is not None
    assert lost.first_seen == {}
    # A later redelivery finds it finished and is dropped; the error says it came.
    late = ledger.begin_execution(
        run.task_id, "w2@host", retries=0, redelivered=True, exclusive=True
    )
    assert (late.execute, late.reason) == (False, "already failed")
    assert Run.objects.get(pk=running.pk).error == run.error + (
        "; the broker redelivered its message afterwards and it was not run"
    )


def test_a_redelivery_that_runs_it_again_resets_the_watch(running, raw_connection):
    recover(running)
    lost = ledger.LostExecutions(after=0.3)
    assert ledger.close_lost_executions(lost) == []
    time.sleep(0.4)
    hold_lock(raw_connection, running)  # the redelivered copy's executor
    again = ledger.begin_execution(
        running.task_id, "w2@host", retries=0, redelivered=True, exclusive=True
    )
    assert again.execute
    assert ledger.close_lost_executions(lost) == []
    die(raw_connection)  # that one dies too: a new watch, keyed by the new execution count
    assert ledger.close_lost_executions(lost) == []
    assert list(lost.first_seen) == [(running.pk, 2)]


def test_runs_the_guard_did_not_start_are_left_alone(make_task, recorder):
    run = ledger.request_run(make_task(every=3600))
    claim(recorder)
    ledger.record_started(run.task_id, "w1@host")  # no guard: executions stays 0
    assert ledger.close_lost_executions(ledger.LostExecutions(after=0)) == []
    assert status(run) == (Run.Status.RUNNING, "")


def test_an_outcome_arriving_after_the_close_replaces_worker_lost(running):
    assert ledger.close_lost_executions(ledger.LostExecutions(after=0)) == [running.task_id]
    assert ledger.record_finished(running.task_id, Run.Status.SUCCEEDED, retries=0) is True
    assert status(running) == (Run.Status.SUCCEEDED, Run.Reason.LATE_OUTCOME)
    assert ledger.record_finished(running.task_id, Run.Status.FAILED, "x", retries=0) is False


def test_reconcile_runs_the_sweep_with_the_replicas_memory(running):
    lost = ledger.LostExecutions(after=0)
    ledger.reconcile(GRACE, lost=lost)
    assert status(running)[0] == Run.Status.FAILED
    ledger.reconcile(GRACE)  # without the memory: no sweep, nothing else changes



def test_under_recover_a_lost_run_is_republished_as_dispatched_and_runs_once_more(
    running, recorder
):
    recover(running)
    recorder.messages.clear()  # the claim's publish
    lost = ledger.LostExecutions(after=0)
    assert ledger.close_lost_executions(lost) == []  # not closed: left to recover
    assert lost.recoverable == [(running.pk, 1)]
    done = ledger.redeliver(ledger.Republisher(recorder), recover=lost.recoverable)
    assert (done.recovered, done.republished, done.closed) == ([running.task_id], [], [])
    assert recorder.task_ids == [running.task_id]  # the same task id
    run = Run.objects.get(pk=running.pk)
    assert (run.status, run.reason, run.republished, run.executions) == (
        Run.Status.DISPATCHED, "recovered: re-published after its worker was lost", 1, 1
    )
    again = ledger.begin_execution(
        run.task_id, "w2@host", retries=0, redelivered=False, exclusive=True
    )
    assert (again.execute, again.reason) == (True, "first delivery")
    assert Run.objects.get(pk=running.pk).executions == 2


def test_under_recover_a_run_lost_past_the_republish_limit_is_closed(running, recorder, settings):
    recover(running)
    settings.SCHEDULING_REPUBLISH_LIMIT = 1
    Run.objects.filter(pk=running.pk).update(republished=1)
    lost = ledger.LostExecutions(after=0)
    assert ledger.close_lost_executions(lost) == [running.task_id]
    assert lost.recoverable == []
    run = Run.objects.get(pk=running.pk)
    assert (run.status, run.reason) == (Run.Status.FAILED, "worker lost")
    assert run.error.endswith("; re-published 1 times: no more")


def test_a_run_taken_by_a_redelivery_before_the_recovery_is_left_to_it(
    running, recorder, raw_connection
):
    recover(running)
    recorder.messages.clear()  # the claim's publish
    lost = ledger.LostExecutions(after=0)
    ledger.close_lost_executions(lost)
    hold_lock(raw_connection, running)  # a redelivery took the lock meanwhile
    done = ledger.redeliver(ledger.Republisher(recorder), recover=lost.recoverable)
    assert (done.recovered, recorder.task_ids) == ([], [])
    assert status(running) == (Run.Status.RUNNING, "")
