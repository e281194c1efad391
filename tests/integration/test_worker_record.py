"""The worker's outcome writes survive a database connection terminated under them."""

from __future__ import annotations

import time
from unittest.mock import patch

import pytest
from django.db import connection
from django.test import override_settings

from scheduling import cadences, ledger, worker
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


def _failing(raw_connection, times: int, pids: list[int]):
    """A write whose first ``times`` attempts find their connection terminated."""

    def finish_on_a_terminated_connection(task_id: str, status: str) -> bool:
        if len(pids) < times:
            pids.append(_terminate_django_connection(raw_connection))
        return ledger.record_finished(task_id, status)

    return finish_on_a_terminated_connection


def test_a_write_failing_past_its_patience_is_logged_and_reported_as_not_recorded(
    make_task, recorder, raw_connection, caplog
):
    run = make_due(make_task(every=60))
    claim(recorder)
    pids: list[int] = []

    def finish_on_a_terminated_connection(task_id: str, status: str) -> bool:
        pids.append(_terminate_django_connection(raw_connection))
        return ledger.record_finished(task_id, status)

    recorded = worker.record(
        finish_on_a_terminated_connection, run.task_id, Run.Status.FAILED, patience=3.0
    )

    assert recorded is False
    # at once, then after the backoff's 0.25-0.5 s and 0.5-1 s: each on a new connection
    assert len(pids) >= 3 and len(set(pids)) == len(pids), pids
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == worker.__name__] == [
        ("ERROR", f"cannot record finish_on_a_terminated_connection for run {run.task_id}"),
    ]
    lost = [r.getMessage() for r in caplog.records if r.name == "scheduling.database_reach"]
    assert len(lost) == 1 and " lost the database (connected to " in lost[0], lost
    run.refresh_from_db()
    assert run.status == Run.Status.DISPATCHED


@override_settings(SCHEDULING_WORKER_LOST_AFTER=30.0)
@patch.multiple(cadences, RETRY_BACKOFF_MAX=0.5)
def test_a_write_failing_within_the_bound_is_tried_again_until_it_is_made(
    make_task, recorder, raw_connection, caplog
):
    """A worker cut off from the database for less than SCHEDULING_WORKER_LOST_AFTER records
    its outcome when it is back, not "worker lost" (issue 18, a worker cut off mid-run)."""
    run = make_due(make_task(every=60))
    claim(recorder)
    pids: list[int] = []

    started = time.monotonic()
    recorded = worker.record(_failing(raw_connection, 4, pids), run.task_id, Run.Status.SUCCEEDED)

    assert recorded is True
    assert len(set(pids)) == 4
    assert time.monotonic() - started < 10  # waits of 0, 0.5, 0.5 s, not the 30 s bound
    assert [r.levelname for r in caplog.records if r.name == worker.__name__] == []
    # one line each way; the "lost" one only when this process had not lost the database already
    # (a write given up, as in the test above, leaves it lost until the next write is made)
    reach = [r.getMessage() for r in caplog.records if r.name == "scheduling.database_reach"]
    assert " reached the database again at " in reach[-1], reach
    assert [m for m in reach[:-1] if " lost the database (connected to " not in m] == [], reach
    assert len(reach) <= 2, reach
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
