"""Issue 16 acceptance 3: a task paused for 30 s under two real replicas (1 s interval).

Nothing is dispatched while paused (the ledger and the worker's log agree), exactly one
``skipped`` row stands for the slots passed, nothing fires on resume and the next slot runs on
time; the task's admin page shows who paused it, since when and why.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from scheduling import ledger
from scheduling.models import Pause, Run
from tests.acceptance.deployment import Deployment, drain, wait_until
from tests.acceptance.outages import assert_whole_grid

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]

EVERY = timedelta(seconds=1)
PAUSE_SECONDS = 30


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@pytest.mark.timeout(600)  # 30 s paused, plus replicas and a worker starting on a busy machine
def test_a_paused_task_under_two_replicas(deployment: Deployment, make_task):
    for name in ("replica-1", "replica-2"):
        deployment.start_beat(name)
    deployment.start_worker("worker-1", concurrency=2)
    deployment.wait_ready()
    start = ledger.database_now() + timedelta(seconds=2)
    task = make_task(every=1, start_time=start, name="paused every second")
    runs = Run.objects.filter(periodic_task=task)
    wait_until(lambda: runs.filter(status="succeeded").count() >= 3, timeout=30)

    call_command("scheduling_pause", str(task.pk), "--reason", "vendor maintenance", "--by", "ops")
    paused = Pause.objects.get(periodic_task=task)
    time.sleep(PAUSE_SECONDS / 2)
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.get(reverse("admin:django_celery_beat_periodictask_change", args=[task.pk]))
    assert (
        f"Paused since {_stamp(paused.paused_at)} UTC by ops</strong>: vendor maintenance"
        in page.content.decode()
    )
    time.sleep(PAUSE_SECONDS / 2)
    resumed = ledger.resume(task, by="ops")
    wait_until(
        lambda: runs.filter(status="succeeded", scheduled_for__gt=resumed.resumed_at).count() >= 3,
        timeout=30,
    )
    deployment.stop("replica-1", "replica-2")
    drain()
    deployment.stop("worker-1")

    rows = list(runs.order_by("scheduled_for"))
    assert_whole_grid(rows, start, EVERY)  # every slot once; the skipped row stands for its slots
    skipped = [r for r in rows if r.status == Run.Status.SKIPPED]
    assert len(skipped) == 1, [(r.scheduled_for, r.status) for r in rows]
    (pause_row,) = skipped
    assert pause_row.reason == "paused by ops: vendor maintenance"
    assert pause_row.pk == resumed.run_id
    # the slots passed while paused: from the first one held back through the resume
    assert pause_row.slots == (resumed.resumed_at - pause_row.scheduled_for) // EVERY + 1
    assert pause_row.slots >= PAUSE_SECONDS - 2
    assert pause_row.scheduled_for >= paused.paused_at - EVERY  # at most one claim under way
    assert pause_row.finished_at == resumed.resumed_at

    dispatched = [r for r in rows if r.dispatched_at is not None]
    during = [r for r in dispatched if paused.paused_at < r.dispatched_at <= resumed.resumed_at]
    assert [r.scheduled_for for r in during if r.scheduled_for >= paused.paused_at] == []
    after = [r for r in dispatched if r.scheduled_for > pause_row.scheduled_for]
    # nothing fired on resume: the next run is the first slot after it, as a slot of its own
    following = after[0]
    assert following.scheduled_for == pause_row.scheduled_for + pause_row.slots * EVERY
    assert resumed.resumed_at < following.scheduled_for <= resumed.resumed_at + EVERY
    assert following.dispatched_at >= following.scheduled_for
    assert (following.slots, following.reason) == (1, "")
    assert following.lateness < timedelta(seconds=5)
    assert [r.slots for r in after] == [1] * len(after)

    # the worker's log: every dispatched run executed once, none of the paused slots
    executed = Counter(
        e["task_id"] for e in deployment.executions()
        if e["periodic_task_name"] == task.name
    )
    assert [tid for tid, n in executed.items() if n > 1] == []
    assert set(executed) == {r.task_id for r in dispatched}
    assert pause_row.task_id not in executed
    assert len(executed) == len(rows) - 2  # all but the skipped row and the pending one
