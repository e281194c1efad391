"""Issue 3 acceptance 3 (CASES C04): every replica stopped across several slots, then restarted.

Two real beat replicas and a worker run interval tasks (every 3 s, misfire grace 4 s) under each
misfire policy; both replicas are stopped for 20 s and new ones started. Each policy must leave
exactly the ledger rows and dispatches it promises, counted by the worker too.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

import pytest
from django_celery_beat.models import PeriodicTask

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import Deployment, drain, wait_until
from tests.acceptance.outages import assert_whole_grid

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]

EVERY = timedelta(seconds=3)
GRACE = timedelta(seconds=4)
OUTAGE_SECONDS = 20
CATCH_UP_LIMIT = 2


def _rows(task: PeriodicTask) -> list[Run]:
    return list(Run.objects.filter(periodic_task=task).order_by("scheduled_for"))


def test_c04_each_misfire_policy_after_all_replicas_were_down(deployment: Deployment, make_task):
    replicas = ["replica-1", "replica-2"]
    for name in replicas:
        deployment.start_beat(name)
    deployment.start_worker("worker-1", concurrency=4)
    deployment.wait_ready()

    start = ledger.database_now() + timedelta(seconds=2)
    tasks: dict[str, PeriodicTask] = {}
    for policy, grace in (("coalesce", 4), ("skip", 4), ("catch_up", 4), ("inside_grace", 60)):
        task = make_task(every=3, start_time=start, name=f"misfire-{policy}")
        TaskPolicy.objects.create(
            periodic_task=task,
            misfire_policy="skip" if policy == "inside_grace" else policy,
            misfire_grace_seconds=grace,
            catch_up_limit=CATCH_UP_LIMIT,
        )
        tasks[policy] = task

    # Up for two slots, then every replica down across several slots, then new replicas.
    wait_until(lambda: Run.objects.filter(status="succeeded").count() >= 8, timeout=20)
    deployment.stop(*replicas)
    down = ledger.database_now()
    time.sleep(OUTAGE_SECONDS)
    up = ledger.database_now()
    for name in ("replica-3", "replica-4"):
        deployment.start_beat(name)
    deployment.wait_for_log("replica-3", "beat: Starting...", timeout=60)
    time.sleep(8)
    deployment.stop("replica-3", "replica-4")
    drain()
    deployment.stop("worker-1")

    executed = Counter(e["task_id"] for e in deployment.executions())
    assert [tid for tid, n in executed.items() if n > 1] == []
    dispatched = Run.objects.exclude(dispatched_at=None)
    assert set(executed) == set(dispatched.values_list("task_id", flat=True))

    for name, task in tasks.items():
        rows = _rows(task)
        # the grid is whole: no slot twice, none left out except the ones a coalesce stands for
        assert rows[-1].status == Run.Status.PENDING, name
        assert_whole_grid(rows, start, EVERY)
        assert [r.status for r in rows if r.status in ("failed", "cancelled", "skipped")] == []
        late = [r for r in rows if r.dispatched_at is not None and r.lateness > GRACE]
        missed = [r for r in rows if r.status == Run.Status.MISSED]
        if name == "inside_grace":
            # 20 s down is inside a 60 s grace: every slot runs at recovery, under any policy
            assert missed == [] and all(r.slots == 1 for r in rows)
            assert len([r for r in rows if r.dispatched_at and r.dispatched_at > up]) >= 6
        elif name == "coalesce":
            assert missed == []
            assert [r.slots for r in late] == [late[0].slots]  # exactly one late dispatch...
            assert late[0].slots >= 5  # ...standing for every slot it missed
            assert late[0].reason == f"misfire: coalesced {late[0].slots} slots"
        elif name == "skip":
            # nothing claimed past its grace ran: every slot due more than the grace before the
            # replicas came back was missed. A slot due after that may be claimed within its grace
            # and still reach the broker (``dispatched_at``) just past it: seen at 4.010 s with a
            # 4 s grace when the replicas took 4 s to start on a busy machine (docs/semantics.md:
            # a misfire is a run *claimed* past its grace)
            assert [r for r in late if r.scheduled_for + GRACE < up] == []
            assert len(missed) >= 4
            # the missed rows are slots from the outage on that were past their grace when the
            # new replicas claimed them (on a busy machine a replica may take longer than the
            # grace to start, so slots just after ``up`` can be past it too)
            assert all(down - EVERY < r.scheduled_for for r in missed)
            assert all(r.finished_at - r.scheduled_for > GRACE for r in missed)
            assert all(r.finished_at > up for r in missed)
            assert {r.reason.split(",")[0] for r in missed} == {"misfire: skip policy"}
        else:  # catch_up
            assert len(missed) >= 3
            # the most recent missed slots run, one run each, right after the missed ones; on a
            # busy machine a slot that came due while the replay went on can be claimed past its
            # grace too, and is caught up in turn: at least the limit, never a slot twice
            assert len(late) >= CATCH_UP_LIMIT
            assert all(r.reason.startswith("misfire: caught up") for r in late)
            assert [r.scheduled_for for r in late[:CATCH_UP_LIMIT]] == [
                missed[-1].scheduled_for + k * EVERY for k in (1, 2)
            ]
    for task in tasks.values():
        task.refresh_from_db()
        assert task.total_run_count == dispatched.filter(periodic_task=task).count()
