"""Issue 3 acceptance 4: a shared crontab row changed while replicas run.

Three real beat replicas and a worker; four periodic tasks share one crontab row. The row is
changed with ``QuerySet.update()`` (no Django signal at all) before its slot: every task's pending
run moves to the new time within one tick, nothing fires at the old time, and each task runs once
at the new time (counted by the worker).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

import pytest
from django_celery_beat.models import CrontabSchedule

from scheduling import ledger
from scheduling.models import Run
from tests.acceptance.deployment import Deployment, drain, wait_until

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]


def test_changing_a_shared_crontab_row_moves_every_task_and_nothing_fires_at_the_old_time(
    deployment: Deployment, make_task
):
    replicas = ["replica-1", "replica-2", "replica-3"]
    for name in replicas:
        deployment.start_beat(name)
    deployment.start_worker("worker-1", concurrency=4)
    deployment.wait_ready()

    now = ledger.database_now()
    old = (now + timedelta(minutes=1)).replace(second=0, microsecond=0)
    if old - now < timedelta(seconds=12):
        old += timedelta(minutes=1)
    new = old + timedelta(minutes=1)
    tasks = [make_task(cron=f"{old.minute} * * * *", name=f"shared-{i}") for i in range(4)]
    ticker = make_task(every=2, name="ticker")  # replicas keep dispatching through the edit
    pending = Run.objects.pending().filter(periodic_task__in=tasks)
    wait_until(lambda: sorted(pending.values_list("scheduled_for", flat=True)) == [old] * 4, 10)

    edited_at = time.monotonic()
    CrontabSchedule.objects.filter(pk=tasks[0].crontab_id).update(minute=str(new.minute))
    wait_until(lambda: sorted(pending.values_list("scheduled_for", flat=True)) == [new] * 4, 5)
    replanned_in = time.monotonic() - edited_at
    assert replanned_in < 2.0  # one tick is at most 1 s, plus the reconcile

    remaining = (new - ledger.database_now()).total_seconds()
    time.sleep(remaining + 4)
    for name in replicas:
        deployment.stop(name)
    drain()
    deployment.stop("worker-1")

    for task in tasks:
        rows = list(Run.objects.filter(periodic_task=task).order_by("scheduled_for")
                    .values_list("scheduled_for", "status", "reason"))
        assert rows == [
            (old, Run.Status.CANCELLED, "schedule edited"),
            (new, Run.Status.SUCCEEDED, ""),
            (new + timedelta(hours=1), Run.Status.PENDING, ""),
        ]
    executions = deployment.executions()
    shared = [e for e in executions if str(e["periodic_task_name"]).startswith("shared-")]
    assert Counter((e["periodic_task_name"], e["scheduled_for"]) for e in shared) == {
        (t.name, new.isoformat()): 1 for t in tasks
    }
    assert len([e for e in executions if e["periodic_task_name"] == ticker.name]) >= 30
