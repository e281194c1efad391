"""Overlap policy (C09), run now and backfill with real beat and worker processes.

Issue 4, acceptance 4-6: executions are counted from the workers' own log.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import Deployment, broker_task_ids

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

OUTAGE_SECONDS = 20


def _wait_until(predicate, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def test_c09_overlap_skip_queues_at_most_one_run_while_workers_are_away(
    deployment: Deployment,
):
    """C09 (shrunk to 20 s): 1 s interval, overlap skip, no worker; then a worker starts."""
    deployment.start_beat("replica-1")
    deployment.wait_ready()
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    task = PeriodicTask.objects.create(name="c09", task="project.tasks.record", interval=every)
    TaskPolicy.objects.create(periodic_task=task, overlap_policy=TaskPolicy.Overlap.SKIP)

    queued: list[int] = []
    deadline = time.monotonic() + OUTAGE_SECONDS
    while time.monotonic() < deadline:
        queued.append(len(broker_task_ids(deployment.queue, waiting_only=True)))
        time.sleep(0.2)
    workers_back = ledger.database_now()
    deployment.start_worker("worker-1", concurrency=1)
    first = _wait_until(
        lambda: Run.objects.filter(periodic_task=task, status=Run.Status.SUCCEEDED).first(), 60
    )
    time.sleep(3)
    deployment.stop("replica-1")

    during = Run.objects.filter(periodic_task=task, scheduled_for__lt=workers_back)
    statuses = Counter(during.values_list("status", flat=True))
    assert max(queued) == 1  # at most one run of the task in the broker at any time
    assert statuses[Run.Status.SUCCEEDED] == 1
    assert statuses[Run.Status.SKIPPED] >= OUTAGE_SECONDS - 3
    assert set(statuses) == {Run.Status.SUCCEEDED, Run.Status.SKIPPED}
    assert first.scheduled_for == during.order_by("scheduled_for").first().scheduled_for
    outage_ids = set(during.values_list("task_id", flat=True))
    executed = [e["task_id"] for e in deployment.executions() if e["task_id"] in outage_ids]
    assert executed == [first.task_id]  # one run executes when workers return, not 20
    skipped = during.filter(status=Run.Status.SKIPPED).first()
    assert skipped.reason.startswith("overlap: the run dispatched at ")
