"""Overlap policy buffer_one with real processes (issue 33, point 5): two beat replicas, one
worker with room for two executions at once, a task every second whose body takes about 3 s.

What ran, and when, comes from the worker's own log (``project.tasks.record`` with ``log_start``:
a start and an end line per execution, each with the database clock), not from the ledger; only
orders and counts are asserted, so a slow machine changes the numbers but not the outcome.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import Deployment, wait_until

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]

#: Executions (ends) to see before the replicas stop: the first, a buffered one, and more.
EXECUTIONS = 3
#: Seconds the body sleeps (the task is due every second).
BODY = 3.0
#: What a scheduled run of the task may be once the replicas stopped and the worker drained.
SETTLED = {
    Run.Status.SUCCEEDED, Run.Status.SKIPPED, Run.Status.BUFFERED, Run.Status.PENDING,
    Run.Status.DISPATCHED, Run.Status.RUNNING,
}


def _spans(deployment: Deployment, ids: set[str]) -> list[tuple[datetime, datetime, str]]:
    """(start, end, task id) of each finished execution of ``ids``, by start (database clock)."""
    starts = {
        e["task_id"]: e["db_at"] for e in deployment.executions("start") if e["task_id"] in ids
    }
    ends = {e["task_id"]: e["db_at"] for e in deployment.executions() if e["task_id"] in ids}
    return sorted(
        (datetime.fromisoformat(starts[i]), datetime.fromisoformat(ends[i]), i) for i in ends
    )


def test_buffer_one_runs_one_execution_at_a_time_and_the_buffered_one_after_it(
    deployment: Deployment,
):
    deployment.start_beat("replica-1")
    deployment.start_beat("replica-2")
    deployment.start_worker("worker-1", concurrency=2)
    deployment.wait_ready()
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    task = PeriodicTask.objects.create(
        name="buffered", task="project.tasks.record", interval=every,
        kwargs=f'{{"label": "buffered", "sleep": {BODY}, "log_start": true}}',
    )
    TaskPolicy.objects.create(periodic_task=task, overlap_policy=TaskPolicy.Overlap.BUFFER_ONE)
    runs = Run.objects.filter(periodic_task=task)

    def ended() -> int:
        ids = set(runs.values_list("task_id", flat=True))
        return sum(1 for e in deployment.executions() if e["task_id"] in ids) >= EXECUTIONS

    wait_until(ended, timeout=120, interval=0.2)
    deployment.stop("replica-1", "replica-2")
    # The worker finishes what it started; a run released after the replicas stopped stays
    # pending, and one dispatched but not started may stay dispatched.
    wait_until(lambda: not runs.filter(status=Run.Status.RUNNING).exists(), timeout=60)
    time.sleep(1)

    ledger = {run.task_id: run for run in runs}
    executions = Counter(
        e["task_id"] for e in deployment.executions() if e["task_id"] in ledger
    )
    assert set(executions.values()) == {1}  # each executed run executed exactly once
    assert {i for i, r in ledger.items() if r.status == Run.Status.SUCCEEDED} == set(executions)

    spans = _spans(deployment, set(ledger))
    assert len(spans) >= EXECUTIONS
    for (_, end, before), (start, _, after) in zip(spans, spans[1:], strict=False):
        # no two executions overlap: each starts after the one before it ended
        assert start > end, (before, after)
    waited = [i for _, _, i in spans[1:] if ledger[i].buffered_at is not None]
    assert waited, "no executed run had been buffered"
    for task_id in waited:
        run = ledger[task_id]
        # the busy run it waited for: dispatched in an earlier claim, or earlier in its own
        assert run.reason.startswith(("buffered: waited for the run dispatched at ",
                                      "buffered: waited for a run dispatched in the same batch"))
        assert run.dispatched_at > run.buffered_at

    statuses = Counter(r.status for r in ledger.values() if r.trigger == Run.Trigger.SCHEDULE)
    assert set(statuses) <= SETTLED, statuses
    assert statuses[Run.Status.SKIPPED] >= 1
    assert statuses[Run.Status.BUFFERED] <= 1
    skipped = [r.reason for r in ledger.values() if r.status == Run.Status.SKIPPED]
    assert all(reason.startswith("overlap: ") for reason in skipped), skipped
