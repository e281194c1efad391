"""The release of a buffered run (schema.sql, block ``release_buffered``) racing a claim whose
run comes due while the transaction ending the busy run is still open: a claim must not read the
busy run unfinished and buffer the run with nothing left to release it once that transaction commits
(docs/lifecycle.md, "The release": "A claim that is buffering a run at the very moment the busy
run ends cannot strand it")."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import GRACE, make_due, unfinished_run

pytestmark = pytest.mark.django_db(transaction=True)


def _dsn() -> str:
    params = connection.get_connection_params()
    keep = ("host", "port", "user", "password", "dbname")
    return " ".join(f"{k}={params[k]}" for k in keep if params.get(k))


def _claim(recorder):
    return ledger.claim_and_dispatch(recorder, replica_id="test:1", batch_size=100, grace=GRACE)


@pytest.mark.parametrize("overlap", [TaskPolicy.Overlap.BUFFER_ALL, TaskPolicy.Overlap.BUFFER_ONE])
def test_a_run_due_while_the_busy_runs_end_is_uncommitted_is_not_stranded(
    make_task, recorder, overlap
):
    task = make_task(every=3600)
    TaskPolicy.objects.create(periodic_task=task, overlap_policy=overlap)
    busy = unfinished_run(task, Run.Status.RUNNING, guarded=True)
    run = make_due(task)
    # Its slot is now, but it comes due a moment later (a jitter offset, say).
    Run.objects.filter(pk=run.pk).update(due_at=ledger.database_now() + timedelta(seconds=1))
    with psycopg.connect(_dsn()) as other:
        # The busy run ends (raw SQL; the same holds for the worker's, the sweep's, the admin's
        # transaction): its trigger has run, its transaction has not committed yet.
        other.execute(
            "UPDATE scheduling_run SET status = 'succeeded', finished_at = clock_timestamp()"
            " WHERE id = %s", [busy.pk],
        )
        time.sleep(1.2)  # the run comes due while the busy run's end is not committed
        during = _claim(recorder)  # buffered (the busy run read unfinished), or not claimed
        assert [d.status for d in during if d.run_id == run.pk] in ([], [Run.Status.BUFFERED])
        other.commit()
    busy.refresh_from_db()
    assert busy.status == Run.Status.SUCCEEDED
    # Nothing of the task is unfinished: the run must not wait for ever.
    assert not Run.objects.filter(
        periodic_task=task, status__in=(Run.Status.DISPATCHED, Run.Status.RUNNING,
                                        Run.Status.RETRYING)
    ).exists()
    # The next claim dispatches the run (it must not wait for ever).
    after = _claim(recorder)
    run.refresh_from_db()
    assert [(d.run_id, d.status) for d in after] == [(run.pk, Run.Status.DISPATCHED)], run.status
    assert recorder.task_ids == [run.task_id]
