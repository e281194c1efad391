"""Chaos against buffer_all: replicas SIGKILLed repeatedly while they claim; then the queue must
drain, every slot run once (worker log) or skipped past the limit, one body at a time."""

from __future__ import annotations

import time

import pytest
from django.db.models import Q
from django.db.models.functions import Now
from django_celery_beat.models import IntervalSchedule
from django.db import transaction

from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import Deployment, wait_until
from tests.acceptance.test_overlap_policies import (
    UNFINISHED, _create, _in_slot_order, _kwargs, _observed, _one_at_a_time,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.once, pytest.mark.django_db(transaction=True)]


def test_buffer_all_survives_replicas_killed_while_claiming(deployment: Deployment):
    deployment.start_beat("replica-1")
    deployment.start_beat("replica-2")
    deployment.start_worker("worker-1", concurrency=2)
    deployment.wait_ready()
    task = _create("chaos", 1, 1.5, overlap_policy=TaskPolicy.Overlap.BUFFER_ALL, buffer_limit=5)
    runs = Run.objects.filter(periodic_task=task)
    end = time.monotonic() + 25
    victim = 1
    while time.monotonic() < end:
        time.sleep(2.5)
        name = f"replica-{victim}"
        deployment.kill(name)
        deployment.restart(name)
        victim = 3 - victim
    hourly, _ = IntervalSchedule.objects.get_or_create(every=1, period="hours")
    with transaction.atomic():
        task.interval, task.kwargs = hourly, _kwargs(task.name, 0.2)
        task.save()
    waiting = runs.filter(
        Q(status__in=(Run.Status.BUFFERED, *UNFINISHED))
        | Q(status=Run.Status.PENDING, buffered_at__isnull=False)
        | Q(status=Run.Status.PENDING, due_at__lte=Now())
    )
    wait_until(lambda: not waiting.exists(), timeout=120, interval=0.2)
    deployment.stop("replica-1", "replica-2")
    time.sleep(0.5)
    _, ledger, executions, executed = _observed(deployment, task, 1)
    assert all(e.end is not None for e in executions)
    _one_at_a_time([(e.start, e.end, e.task_id) for e in executions])
    _in_slot_order(executions, ledger)
    skipped = {i for i, r in ledger.items() if r.status == Run.Status.SKIPPED}
    assert executed | skipped == set(ledger) and not executed & skipped, [
        (r.scheduled_for, r.status, r.reason) for i, r in ledger.items()
        if i not in executed | skipped
    ]
    for i in skipped:
        assert ledger[i].reason == Run.Reason.buffer_limit(5), ledger[i].reason
