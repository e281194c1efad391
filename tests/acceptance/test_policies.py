"""Overlap policy (C09), run now and backfill with real beat and worker processes.

Issue 4, acceptance 4-6: executions are counted from the workers' own log.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import (
    Deployment,
    broker_is_redis,
    broker_task_ids,
    wait_until,
)

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]

OUTAGE_SECONDS = 20


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
    first = wait_until(
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


def test_run_now_from_the_admin_and_the_command_dispatches_and_executes_once_each(
    deployment: Deployment, client
):
    """Acceptance 5: admin action (with and without permission) and ``manage.py run_now``."""
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.urls import reverse

    deployment.start_beat("replica-1")
    deployment.start_worker("worker-1", concurrency=1)
    deployment.wait_ready()
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period="hours")
    task = PeriodicTask.objects.create(name="manual", task="project.tasks.record", interval=every)
    changelist = reverse("admin:django_celery_beat_periodictask_changelist")
    action = {"action": "run_tasks", "_selected_action": [task.pk]}

    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_periodictask"))
    client.force_login(viewer)
    client.post(changelist, action, follow=True)
    assert Run.objects.filter(trigger=Run.Trigger.MANUAL).count() == 0

    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    response = client.post(changelist, action, follow=True)
    assert "1 manual run queued" in response.content.decode()
    call_command("run_now", "manual", "--requested-by", "cli")

    manual = Run.objects.filter(trigger=Run.Trigger.MANUAL)
    wait_until(lambda: manual.filter(status=Run.Status.SUCCEEDED).count() == 2, timeout=60)
    time.sleep(1)
    runs = {r.requested_by: r for r in manual}
    assert sorted(runs) == ["cli", "root"]
    assert {(r.claimed_by, r.executions, r.suppressed) for r in runs.values()} == {
        ("replica-1", 1, 0)
    }
    executed = Counter(e["task_id"] for e in deployment.executions())
    assert executed == Counter({r.task_id: 1 for r in runs.values()})
    if not broker_is_redis():  # the SQL transport keeps delivered messages: one each
        assert Counter(broker_task_ids(deployment.queue)) == executed


def test_backfill_of_ten_slots_twice_runs_each_slot_once_in_order(deployment: Deployment):
    """Acceptance 6: ``manage.py backfill`` twice over a 10-slot past range."""
    from io import StringIO

    from django.core.management import call_command

    deployment.start_beat("replica-1")
    deployment.start_worker("worker-1", concurrency=1)
    deployment.wait_ready()
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period="minutes")
    start = (ledger.database_now() - timedelta(hours=1)).replace(second=0, microsecond=0)
    task = PeriodicTask.objects.create(
        name="report", task="project.tasks.record", interval=every, start_time=start
    )
    since, until = start.isoformat(), (start + timedelta(minutes=10)).isoformat()
    out = StringIO()
    call_command("backfill", "report", "--since", since, "--until", until, stdout=out)
    backfill = Run.objects.filter(trigger=Run.Trigger.BACKFILL)
    wait_until(lambda: backfill.filter(status=Run.Status.SUCCEEDED).count() == 10, timeout=60)
    call_command("backfill", "report", "--since", since, "--until", until, stdout=out)
    time.sleep(2)

    runs = list(backfill.order_by("scheduled_for"))
    assert [r.scheduled_for for r in runs] == [start + timedelta(minutes=i) for i in range(10)]
    assert {(r.status, r.executions, r.suppressed) for r in runs} == {
        (Run.Status.SUCCEEDED, 1, 0)
    }
    dispatched = [r.dispatched_at for r in runs]
    assert dispatched == sorted(dispatched)
    ids = [r.task_id for r in runs]
    assert [e["task_id"] for e in deployment.executions() if e["task_id"] in ids] == ids
    lines = out.getvalue().splitlines()
    assert lines[-1].endswith("10 slots, 0 new runs, 10 already there")
    assert any(line.endswith("10 slots, 10 new runs, 0 already there") for line in lines)
    assert task.pk == runs[0].periodic_task_id
