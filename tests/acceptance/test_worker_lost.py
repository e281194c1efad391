"""A worker SIGKILLed mid-run: the replicas close its run as failed, "worker lost".

kombu's SQL transport never redelivers the killed worker's message, and Redis does so only after
its visibility timeout (an hour by default), so without the sweep the run would stay running.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from scheduling import ledger
from scheduling.models import Run
from tests.acceptance.deployment import Deployment, wait_until

# The database's own bounds and locks are the point; the broker in use is incidental.
pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]

LOST_AFTER = 3.0
RECONCILE = 1.0


def test_a_killed_workers_run_is_closed_as_worker_lost(tmp_path, make_task):
    deployment = Deployment(
        tmp_path,
        SCHEDULING_WORKER_LOST_AFTER=str(LOST_AFTER),
        SCHEDULING_RECONCILE_INTERVAL=str(RECONCILE),
    )
    try:
        deployment.start_beat("replica-1")
        deployment.start_worker("worker-a", concurrency=1)
        deployment.wait_ready()
        task = make_task(
            clocked=ledger.database_now() + timedelta(seconds=2), name="lost",
            kwargs=json.dumps({"label": "lost", "sleep": 60, "log_start": True}),
        )
        run = wait_until(
            lambda: Run.objects.filter(periodic_task=task, status=Run.Status.RUNNING).first(), 60
        )
        time.sleep(LOST_AFTER + 2 * RECONCILE)  # a live worker's run is never closed
        assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
        deployment.kill("worker-a")
        killed_at = ledger.database_now()
        run = wait_until(
            lambda: Run.objects.filter(pk=run.pk, status=Run.Status.FAILED).first(), 30
        )
        deployment.start_worker("worker-b", concurrency=1)
        deployment.wait_for_log("worker-b", "ready.", timeout=60)
        time.sleep(2)  # a redelivery, if there were one, would be dropped now
        run.refresh_from_db()
    finally:
        deployment.stop()

    closed_after = (run.finished_at - killed_at).total_seconds()
    print(f"closed {closed_after:.2f} s after the kill")
    assert LOST_AFTER <= closed_after <= LOST_AFTER + RECONCILE + 3.0
    assert (run.status, run.reason, run.executions) == (Run.Status.FAILED, "worker lost", 1)
    assert run.worker.startswith("worker-a@")
    starts = [e["task_id"] for e in deployment.executions("start")]
    assert starts == [run.task_id]
    assert deployment.executions() == []  # the body never finished anywhere
