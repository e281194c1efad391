"""The worker's own PostgreSQL session (``guard.liveness``) on real PostgreSQL: a first
delivery's start and its outcome, one statement each, a forked process's session, an error in
the middle of a statement."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import psycopg
import pytest
from django.db import connection

from scheduling import guard, ledger, worker
from scheduling.models import Run
from tests.conftest import connect_raw
from tests.integration.conftest import claim

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_FREE = "SELECT pg_try_advisory_lock(scheduling_execution_lock_key(%s, %s))"


@pytest.fixture
def dispatched(make_task, recorder) -> Run:
    """A manual run, claimed and dispatched; the worker session closed before and after."""
    guard.liveness.close()
    run = ledger.request_run(make_task(every=3600))
    claim(recorder)
    run.refresh_from_db()
    assert run.status == Run.Status.DISPATCHED
    yield run
    guard.liveness.close()


def _row(run: Run) -> tuple[str, str, int, int, int, str]:
    run.refresh_from_db()
    return run.status, run.worker, run.retries, run.executions, run.suppressed, run.error


def _lock_free(key: guard.Attempt) -> bool:
    """Whether another session can take ``key``'s execution lock (it releases it at once)."""
    with connect_raw() as other:
        other.autocommit = True
        free = other.execute(LOCK_FREE, key).fetchone()[0]
        other.execute("SELECT pg_advisory_unlock_all()")
    return free


def test_a_first_delivery_starts_and_finishes_without_django_s_connection(dispatched):
    connection.close()  # as Celery's Django fix-up does before every task
    request = SimpleNamespace(get={"retries": 0, "hostname": "w1@host"}.get)
    guard.guard(request, dispatched.task_id)
    key = getattr(request, guard.LOCK_ATTRIBUTE)
    assert key == guard.Attempt(dispatched.task_id, 0)
    assert guard.liveness.finish(key, Run.Status.SUCCEEDED) is True
    assert connection.connection is None  # neither statement went through Django's connection
    assert _row(dispatched) == (Run.Status.SUCCEEDED, "w1@host", 0, 1, 0, "")
    assert _lock_free(key) is True
    assert guard.liveness.finish(key, Run.Status.FAILED, "late") is False  # finished: kept


def test_the_start_holds_the_lock_and_a_copy_is_suppressed(dispatched):
    key = guard.Attempt(dispatched.task_id, 0)
    assert guard.liveness.start(key, "w1@host") == (True, True)
    assert _lock_free(key) is False
    assert guard.liveness.start(key, "w1@host") == (False, False)  # the same attempt again
    request = SimpleNamespace(get={"retries": 0, "hostname": "w2@host"}.get)
    with pytest.raises(guard.Ignore):
        guard.guard(request, dispatched.task_id)
    assert _row(dispatched) == (Run.Status.RUNNING, "w1@host", 0, 1, 1, "")
    assert guard.liveness.finish(key, Run.Status.FAILED, "ValueError: x" * 300) is True
    assert _row(dispatched)[0::5] == (Run.Status.FAILED, ("ValueError: x" * 300)[:2000])
    assert _lock_free(key) is True


def test_a_forked_process_opens_a_session_of_its_own_and_leaves_the_parent_s(dispatched):
    assert guard.liveness.try_lock(guard.Attempt("parent", 0)) is True
    parent = guard.liveness.backend_pid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: no pytest from here on, only the session and the pipe
        code = 1
        try:
            before = guard.liveness.backend_pid()
            started = guard.liveness.start(guard.Attempt(dispatched.task_id, 0), "child@host")
            os.write(write, f"{before} {started} {guard.liveness.backend_pid()}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(child, 0)
    told = os.read(read, 200).decode().split()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert told[:2] == ["None", "(True,"] and told[2] == "True)"
    assert int(told[3]) not in (0, parent)
    assert guard.liveness.backend_pid() == parent  # the child's exit did not end it
    assert guard.liveness.try_lock(guard.Attempt("parent", 1)) is True
    assert _lock_free(guard.Attempt("parent", 0)) is False  # still held by the parent
    assert _row(dispatched)[:4] == (Run.Status.RUNNING, "child@host", 0, 1)
    assert _lock_free(guard.Attempt(dispatched.task_id, 0)) is True  # freed with the child


def _waiting_pid(other: psycopg.Connection, not_pid: int | None, timeout: float = 20.0) -> int:
    """The guard session's server pid once it waits for a row lock (not ``not_pid``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = other.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'scheduling-guard'"
            " AND wait_event_type = 'Lock' AND pid IS DISTINCT FROM %s", [not_pid]
        ).fetchone()
        if row:
            return row[0]
        time.sleep(0.02)
    raise AssertionError("the guard's session never waited for the run's row")


def test_an_error_mid_statement_drops_the_session_and_the_outcome_lands_on_a_new_one(dispatched):
    key = guard.Attempt(dispatched.task_id, 0)
    assert guard.liveness.start(key, "w1@host") == (True, True)
    first = guard.liveness.backend_pid()
    results: list[bool] = []
    with connect_raw() as other, connect_raw() as blocker:
        other.autocommit = True  # a fresh look at pg_stat_activity each time
        blocker.execute("SELECT 1 FROM scheduling_run WHERE id = %s FOR UPDATE", [dispatched.pk])
        recording = threading.Thread(target=lambda: results.append(
            worker.record(guard.liveness.finish, key, Run.Status.SUCCEEDED, patience=30)
        ))
        recording.start()
        assert _waiting_pid(other, None) == first
        # The outcome's statement is cancelled mid-way: the session is closed (its lock freed),
        # and record() sends the outcome again at once on a new session.
        other.execute("SELECT pg_cancel_backend(%s)", [first])
        second = _waiting_pid(other, first)
        assert other.execute(LOCK_FREE, key).fetchone()[0] is True  # the first's lock is gone
        other.execute("SELECT pg_advisory_unlock_all()")
        blocker.rollback()
        recording.join(timeout=30)
    assert results == [True]
    assert guard.liveness.backend_pid() == second
    assert guard.liveness._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert _row(dispatched) == (Run.Status.SUCCEEDED, "w1@host", 0, 1, 0, "")
