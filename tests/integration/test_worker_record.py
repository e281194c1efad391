"""The worker's outcome writes survive a database connection terminated under them."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from scheduling import ledger, worker
from scheduling.models import Run
from tests.integration.conftest import claim, make_due

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate_django_connection(raw_connection) -> int:
    """Terminate the backend of Django's connection from the second connection; return its pid."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    raw_connection.execute("SELECT pg_terminate_backend(%s)", [pid])
    raw_connection.commit()
    deadline = time.monotonic() + 5
    # each poll in its own transaction: pg_stat_activity is a snapshot per transaction
    while raw_connection.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
    ).fetchone() != (0,):
        raw_connection.commit()
        assert time.monotonic() < deadline, "the backend did not exit"
        time.sleep(0.05)
    raw_connection.commit()
    return pid


def test_an_outcome_write_on_a_terminated_connection_is_retried_after_reconnecting(
    make_task, recorder, raw_connection
):
    run = make_due(make_task(every=60))
    claim(recorder)
    assert worker.record(ledger.record_started, run.task_id, "worker-1@host") is True

    pid = _terminate_django_connection(raw_connection)
    assert worker.record(ledger.record_finished, run.task_id, Run.Status.SUCCEEDED) is True

    assert connection.connection.info.backend_pid != pid
    run.refresh_from_db()
    assert (run.status, run.worker, run.error) == (Run.Status.SUCCEEDED, "worker-1@host", "")


def test_a_write_failing_twice_is_logged_and_reported_as_not_recorded(
    make_task, recorder, raw_connection, caplog
):
    run = make_due(make_task(every=60))
    claim(recorder)
    pids = []

    def finish_on_a_terminated_connection(task_id: str, status: str) -> bool:
        pids.append(_terminate_django_connection(raw_connection))
        return ledger.record_finished(task_id, status)

    recorded = worker.record(finish_on_a_terminated_connection, run.task_id, Run.Status.FAILED)

    assert recorded is False
    assert len(set(pids)) == 2  # the second attempt ran on a new connection, terminated as well
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == worker.__name__] == [
        ("ERROR", f"cannot record finish_on_a_terminated_connection for run {run.task_id}")
    ]
    run.refresh_from_db()
    assert run.status == Run.Status.DISPATCHED
