"""The worker guard's decision on real PostgreSQL: one execution per run, retries, lost workers."""

from __future__ import annotations

import time
from datetime import datetime
from types import SimpleNamespace

import psycopg
import pytest
from django.db import connection

from scheduling import guard, ledger
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import claim

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def dispatched(make_task, recorder) -> Run:
    """A manual run, claimed and dispatched."""
    run = ledger.request_run(make_task(every=3600))
    claim(recorder)
    run.refresh_from_db()
    assert run.status == Run.Status.DISPATCHED
    return run


def begin(run: Run, *, retries: int = 0, redelivered: bool = False, exclusive: bool = True):
    return ledger.begin_execution(
        run.task_id, "w1@host", retries=retries, redelivered=redelivered, exclusive=exclusive
    )


def counters(run: Run) -> tuple[str, int, int, int]:
    run.refresh_from_db()
    return run.status, run.retries, run.executions, run.suppressed


def test_first_delivery_executes_and_a_duplicate_on_a_live_worker_is_suppressed(dispatched):
    first = begin(dispatched)
    assert (first.outcome, first.reason) == (ledger.Outcome.EXECUTE, "first delivery")
    assert counters(dispatched) == (Run.Status.RUNNING, 0, 1, 0)
    assert dispatched.worker == "w1@host"

    # A re-publish while the lock is held elsewhere, and a redelivery with the lock held.
    assert begin(dispatched, exclusive=False).execute is False
    assert begin(dispatched, redelivered=True, exclusive=False).execute is False
    # A re-publish (not redelivered) with the lock free: no evidence the worker died.
    assert begin(dispatched).execute is False
    assert counters(dispatched) == (Run.Status.RUNNING, 0, 1, 3)


def test_a_finished_run_is_never_executed_again(dispatched):
    begin(dispatched)
    ledger.record_finished(dispatched.task_id, Run.Status.SUCCEEDED, retries=0)
    late = begin(dispatched, redelivered=True)
    assert (late.execute, late.reason) == (False, "already succeeded")
    assert counters(dispatched) == (Run.Status.SUCCEEDED, 0, 1, 1)


def test_a_redelivery_after_the_worker_died_executes_once_more_under_recover(dispatched):
    TaskPolicy.objects.create(
        periodic_task=dispatched.periodic_task, worker_lost_policy=TaskPolicy.WorkerLost.RECOVER
    )
    begin(dispatched)
    again = begin(dispatched, redelivered=True)  # the lock was free: its holder is gone
    assert (again.execute, again.reason) == (
        True, "re-executed: redelivered, and the worker that ran it is gone"
    )
    assert counters(dispatched) == (Run.Status.RUNNING, 0, 2, 0)
    assert Run.objects.get(pk=dispatched.pk).reason == again.reason


def test_under_fail_a_redelivery_after_the_worker_died_closes_the_run_saying_so(dispatched):
    begin(dispatched)  # the default policy: SCHEDULING_WORKER_LOST_POLICY "fail"
    again = begin(dispatched, redelivered=True)
    assert (again.execute, again.reason) == (False, "duplicate of a running run (attempt 0)")
    run = Run.objects.get(pk=dispatched.pk)
    assert (run.status, run.reason, run.executions, run.suppressed) == (
        Run.Status.FAILED, "worker lost", 1, 1
    )
    assert run.error == (
        "the worker running it died mid-run; the broker redelivered its message and it was not "
        "run again (worker-loss policy fail)"
    )
    assert run.finished_at is not None
    assert begin(dispatched, redelivered=True).execute is False  # and stays closed
    assert counters(dispatched) == (Run.Status.FAILED, 0, 1, 2)


def test_a_run_closed_not_delivered_executes_when_its_message_arrives_after_all(dispatched):
    Run.objects.filter(pk=dispatched.pk).update(
        status=Run.Status.FAILED, reason=Run.Reason.NOT_DELIVERED, error="no worker started it",
        finished_at=ledger.database_now(),
    )
    late = begin(dispatched)
    assert (late.execute, late.reason) == (True, "delivered after it was closed as not delivered")
    run = Run.objects.get(pk=dispatched.pk)
    assert (run.status, run.reason, run.error, run.finished_at, run.executions) == (
        Run.Status.RUNNING, "delivered after it was closed as not delivered", "", None, 1
    )
    assert begin(dispatched, redelivered=True).execute is False  # once: it has run now


def test_celery_retries_execute_and_stale_attempts_do_not(dispatched):
    begin(dispatched)
    first_start = Run.objects.get(pk=dispatched.pk).started_at
    assert ledger.record_retry(dispatched.task_id, "Retry in 0s", retries=0)
    assert counters(dispatched) == (Run.Status.RETRYING, 0, 1, 0)
    assert begin(dispatched, redelivered=True).execute is False  # attempt 0 again
    assert begin(dispatched, retries=1).execute is True
    # The next attempt's message overtook attempt 1's retry signal: the run stays running.
    assert begin(dispatched, retries=2).execute is True
    assert ledger.record_retry(dispatched.task_id, "late", retries=1) is False
    assert ledger.record_finished(dispatched.task_id, Run.Status.FAILED, "x", retries=1) is False
    assert ledger.record_finished(dispatched.task_id, Run.Status.SUCCEEDED, retries=2) is True
    assert counters(dispatched) == (Run.Status.SUCCEEDED, 2, 3, 1)
    events = Run.objects.get(pk=dispatched.pk).events  # the one retry recorded, not the stale one
    assert [(e["kind"], e["detail"], e["worker"]) for e in events] == [
        ("retry", "attempt 1 failed and is retried: Retry in 0s", "w1@host")
    ]
    assert datetime.fromisoformat(events[0]["started"]) == first_start  # attempt 1's own
    at = datetime.fromisoformat(events[0]["at"])
    assert Run.objects.get(pk=dispatched.pk).dispatched_at < at < ledger.database_now()


def test_a_redelivered_earlier_attempt_leaves_the_running_attempt_alone(dispatched):
    """Attempt 0's message redelivered (its lock is free: that attempt is over) while attempt 1
    runs: a duplicate, and the run stays running."""
    begin(dispatched)
    assert ledger.record_retry(dispatched.task_id, "Retry in 0s", retries=0)
    assert begin(dispatched, retries=1).execute is True
    stale = begin(dispatched, redelivered=True)
    assert (stale.outcome, stale.reason) == (
        ledger.Outcome.SUPPRESS, "duplicate of a running run (attempt 1)"
    )
    assert counters(dispatched) == (Run.Status.RUNNING, 1, 2, 1)


def test_a_run_whose_claim_rolled_back_is_adopted_by_its_first_delivery(make_task):
    run = ledger.request_run(make_task(every=3600))  # pending: published, claim not committed
    adopted = begin(run)
    assert (adopted.outcome, adopted.reason) == (
        ledger.Outcome.EXECUTE,
        "adopted by the worker: the publishing replica's claim did not commit",
    )
    run.refresh_from_db()
    assert (run.status, run.executions) == (Run.Status.RUNNING, 1)
    assert run.dispatched_at == run.started_at


def test_unknown_task_ids_execute_untracked_and_cancelled_runs_are_dropped(make_task):
    untracked = ledger.begin_execution(
        "not-a-run", "w", retries=0, redelivered=False, exclusive=True
    )
    assert (untracked.outcome, untracked.reason) == (
        ledger.Outcome.UNTRACKED, "no run has this task id"
    )
    run = ledger.request_run(make_task(every=3600))
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED)
    assert (begin(run).execute, begin(run).reason) == (False, "already cancelled")


def test_expired_and_unknown_close_only_runs_not_started(dispatched, make_task):
    assert ledger.record_not_executed(
        dispatched.task_id, Run.Status.EXPIRED, "message expired before a worker took it"
    )
    dispatched.refresh_from_db()
    assert (dispatched.status, dispatched.reason) == (
        Run.Status.EXPIRED, "message expired before a worker took it"
    )
    assert dispatched.finished_at is not None
    running = ledger.request_run(make_task(every=3600))
    begin(running)
    assert not ledger.record_not_executed(running.task_id, Run.Status.FAILED, "unknown task")
    assert Run.objects.get(pk=running.pk).status == Run.Status.RUNNING


def _other_session() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def _try(conn: psycopg.Connection, key: guard.Attempt) -> bool:
    statement = "SELECT pg_try_advisory_lock(scheduling_execution_lock_key(%s, %s))"
    return conn.execute(statement, key).fetchone()[0]


def test_the_execution_lock_is_freed_when_its_session_ends():
    key = guard.Attempt("some-task-id", 0)
    assert guard.liveness.try_lock(key) is True
    assert guard.liveness.try_lock(key) is False  # the same attempt again in this process
    other = _other_session()
    try:
        assert _try(other, key) is False
        assert _try(other, guard.Attempt("some-task-id", 1)) is True  # another attempt
        guard.liveness.close()  # the process "dies": its session ends
        # the server frees the lock once the backend has exited, a moment after the close
        deadline = time.monotonic() + 5
        freed = _try(other, key)
        while not freed and time.monotonic() < deadline:
            time.sleep(0.02)
            freed = _try(other, key)
        assert freed is True
    finally:
        other.execute("SELECT pg_advisory_unlock_all()")  # at once, not when its backend exits
        other.close()
        guard.liveness.unlock(key)
    assert guard.liveness.try_lock(key) is True  # a fresh session, nothing held
    guard.liveness.close()


def test_a_lock_session_ended_by_the_server_requeues_the_delivery(dispatched):
    """Found by the chaos run: an error of the guard's own session raised TypeError, not Reject."""
    from celery.exceptions import Reject

    guard.liveness.try_lock(guard.Attempt("warm-up", 0))
    pid = guard.liveness.backend_pid()
    other = _other_session()
    try:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    request = SimpleNamespace(get={"retries": 0, "hostname": "w1@host"}.get)
    with pytest.raises(Reject) as caught:
        guard.guard(request, dispatched.task_id)
    assert caught.value.requeue is True
    assert counters(dispatched) == (Run.Status.DISPATCHED, 0, 0, 0)
    guard.liveness.close()


def test_a_message_ahead_of_the_ledger_waits_until_its_slot_is_planned_again(make_task):
    """After an asynchronous failover: the promoted standby lacks the old primary's last runs,
    whose messages are in the broker. Such a message is requeued until a replica plans its slot
    again (same deterministic task id), then runs once by the usual rule."""
    from datetime import timedelta

    from celery.exceptions import Reject

    from scheduling import slots
    from scheduling.ledger.writes import insert_pending
    from tests.integration.conftest import make_due

    task = make_task(every=60)
    run = make_due(task)  # the ledger's latest run: pending at "now"
    lost = run.scheduled_for + timedelta(seconds=60)  # the run of the next slot, lost
    lost_id = slots.task_id_for(task.pk, lost)

    def deliver(task_id: str, slot: tuple[str, object]) -> tuple[ledger.Outcome, str]:
        found = ledger.begin_execution(
            task_id, "w1@host", retries=0, redelivered=False, exclusive=True, slot=slot  # type: ignore[arg-type]
        )
        return found.outcome, found.reason

    assert deliver(lost_id, (task.name, lost)) == (
        ledger.Outcome.REQUEUE,
        (
            "its slot is past the task's latest run: the ledger is behind its messages (a "
            "failover lost its tail?) until a replica plans the slot again"
        ),
    )
    headers = {"scheduling_run": 1, "periodic_task_name": task.name,
               "scheduled_for": lost.isoformat(), "retries": 0, "hostname": "w1@host"}
    request = SimpleNamespace(get=headers.get)
    with pytest.raises(Reject) as caught:
        guard.guard(request, lost_id)
    assert caught.value.requeue is True
    assert not Run.objects.filter(task_id=lost_id).exists()

    # Untracked as before: an id that is not the slot's scheduled run (a manual run), a slot the
    # ledger has passed (the row pruned), a task that no longer exists or is disabled.
    untracked = (ledger.Outcome.UNTRACKED, "no run has this task id")
    assert deliver("manual-run-id", (task.name, lost)) == untracked
    earlier = run.scheduled_for - timedelta(seconds=60)
    assert deliver(slots.task_id_for(task.pk, earlier), (task.name, earlier)) == untracked
    assert deliver(lost_id, ("no such task", lost)) == untracked

    # A replica plans the slot again (the claim of the run before it): the delivery runs.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    insert_pending([(task, lost)])
    assert deliver(lost_id, (task.name, lost)) == (
        ledger.Outcome.EXECUTE,
        "adopted by the worker: the publishing replica's claim did not commit",
    )
    assert Run.objects.get(task_id=lost_id).executions == 1
    guard.liveness.close()
