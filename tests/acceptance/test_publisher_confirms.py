"""Issue 14: a publish RabbitMQ refuses is not committed dispatched; once accepted it runs once.

A real beat replica publishes into a queue that holds one waiting message and refuses the next
(``tests.acceptance.refusing_queue``: ``x-max-length`` 1, ``x-overflow: reject-publish``), filled
before the run is due. With publisher confirms the broker's ``basic.nack`` makes the publish
raise: the claim rolls back, the run stays pending and the replica logs the failure and retries.
A worker started later takes the filler; the queue accepts again, the run is dispatched by the
next retry and executes exactly once (counted from the worker's execution log). Without confirms
the refused message would be dropped and the run committed dispatched: the test fails there.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

import pytest

from project.celery import app
from scheduling import ledger
from scheduling.models import Run
from tests.acceptance.deployment import (
    Deployment,
    broker_is_amqp,
    broker_task_ids,
    drain,
    wait_until,
)
from tests.acceptance.refusing_queue import FILLER_LABEL, fill, waiting

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.broker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not broker_is_amqp(), reason="publisher confirms are an AMQP feature"),
]

SETTINGS = "tests.acceptance.settings_refusing_queue"
#: Refused publishes of the run to see (one per tick, the replica backing off) before the worker
#: starts and the queue can accept it.
REFUSALS = 3


def test_a_refused_publish_stays_pending_and_runs_once_when_accepted(tmp_path, make_task):
    deployment = Deployment(tmp_path, DJANGO_SETTINGS_MODULE=SETTINGS)
    try:
        filler = fill(app, deployment.queue)
        # debug: every refused publish is a line ("broker still unavailable: ..."), not only
        # the first of the outage
        deployment.start_beat("replica-1", SCHEDULING_LOG_LEVEL="DEBUG")
        deployment.wait_ready()
        task = make_task(clocked=ledger.database_now() + timedelta(seconds=2), name="confirmed")
        run = wait_until(lambda: Run.objects.filter(periodic_task=task).first(), timeout=30)
        refused = f"cannot publish run {run.task_id}: the broker refused the message (basic.nack)"

        def refused_often_enough() -> bool:
            # checked on every poll: the run must never be committed while it is refused
            assert Run.objects.get(pk=run.pk).status == Run.Status.PENDING, (
                "run committed while the broker refused its message"
            )
            return deployment.log_path("replica-1").read_text().count(refused) >= REFUSALS

        wait_until(refused_often_enough, timeout=60)
        held = waiting(deployment.queue)
        worker_started = ledger.database_now()
        deployment.start_worker("worker-1")
        run = wait_until(
            lambda: Run.objects.filter(pk=run.pk, status=Run.Status.SUCCEEDED).first(),
            timeout=90,
        )
        deployment.stop("replica-1")
        drain()
        left = broker_task_ids(deployment.queue)
        deployment.stop("worker-1")
    finally:
        deployment.stop()
        for name in deployment.processes:
            print(f"--- {name} ---\n{deployment.tail(name, 15)}")

    assert held == 1  # the filler only: no refused copy of the run was enqueued
    log = deployment.log_path("replica-1").read_text()
    first = re.findall(r"ERROR .*broker unavailable, retrying with backoff: (.*)", log)
    assert first == [refused]  # one error line for the outage, the later ones at debug
    (failed_ticks,) = re.findall(r"broker reachable again after (\d+) failed ticks", log)
    assert int(failed_ticks) >= REFUSALS

    # Committed once, by the replica, after the worker had drained the queue.
    assert (run.status, run.claimed_by, run.executions, run.suppressed) == (
        Run.Status.SUCCEEDED, "replica-1", 1, 0
    )
    assert run.dispatched_at > worker_started
    assert Run.objects.filter(periodic_task=task).count() == 1

    # Executed exactly once, counted by the worker; the filler ran too, once.
    executed = Counter((e["task_id"], e["label"]) for e in deployment.executions())
    assert executed == Counter({(filler, FILLER_LABEL): 1, (run.task_id, ""): 1})
    assert left == []  # nothing else waits in the queue
