"""Invariant 9 with real processes: no run is lost after dispatch, and none runs twice.

Issue 14. Each test runs real beat replicas and ``celery worker`` processes on a queue of their
own; executions are counted from the workers' own log (``project.tasks.record``), the broker's
content from the broker itself (``tests.acceptance.queues``), the re-publishes from the ledger:

- messages purged from the broker are re-published with their task ids within the delivery
  deadline plus a reconcile pass, and each run executes once;
- a worker SIGKILLed with runs executing and runs prefetched: under worker-loss policy
  ``recover`` every run executes to the end once, under ``fail`` the cut runs end "worker lost"
  and the prefetched ones still execute once;
- a backlog behind no worker for three deadlines holds at most 1 + SCHEDULING_REPUBLISH_LIMIT
  messages per run, and each run executes once when the workers come.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest
from django.db.models import Sum
from django_celery_beat.models import ClockedSchedule

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance import queues
from tests.acceptance.deployment import Deployment, drain, wait_until

# What reaches the broker, what it loses and what it redelivers is the point: every test here
# runs again on RabbitMQ.
pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.broker,
    pytest.mark.django_db(transaction=True),
]

#: A replica's longest sleep between two ticks (cadences.MAX_INTERVAL, 0.5 s by default),
#: rounded up, seconds.
TICK = 1.0
#: Time a busy 2-core machine may add to any step of a process (a poll, a pass, a start), seconds.
SLACK = 3.0


def _clocked_tasks(make_task, count: int, prefix: str, in_seconds: float, **kwargs: object):
    """``count`` one-off tasks of ``project.tasks.record`` sharing one clocked slot."""
    clocked = ClockedSchedule.objects.create(
        clocked_time=ledger.database_now() + timedelta(seconds=in_seconds)
    )
    return [
        make_task(
            clocked=clocked, name=f"{prefix}-{i}",
            kwargs=json.dumps({"label": f"{prefix}-{i}", **kwargs}),
        )
        for i in range(count)
    ]


def _runs(tasks) -> list[Run]:
    return list(Run.objects.filter(periodic_task__in=tasks).order_by("pk"))


def _deliveries() -> int:
    """Deliveries the workers' guard has decided on: executions plus suppressed duplicates."""
    totals = Run.objects.aggregate(executions=Sum("executions"), suppressed=Sum("suppressed"))
    return (totals["executions"] or 0) + (totals["suppressed"] or 0)


def _republished(tasks) -> int:
    return Run.objects.filter(periodic_task__in=tasks).aggregate(n=Sum("republished"))["n"]


def _log_count(deployment: Deployment, text: str, *names: str) -> int:
    return sum(deployment.log_path(name).read_text().count(text) for name in names)


PURGED = 30
PURGE_DEADLINE = 5.0
PURGE_RECONCILE = 2.0
REPUBLISH_LIMIT = 3  # SCHEDULING_REPUBLISH_LIMIT's default


def test_messages_purged_from_the_broker_are_republished_and_each_run_executes_once(
    tmp_path, make_task
):
    """30 runs dispatched by two replicas, then purged from the broker before any worker ran:
    each is re-published with its task id within the deadline plus a reconcile pass, and each
    executes exactly once."""
    deployment = Deployment(
        tmp_path,
        SCHEDULING_DELIVERY_TIMEOUT=str(PURGE_DEADLINE),
        SCHEDULING_RECONCILE_INTERVAL=str(PURGE_RECONCILE),
    )
    replicas = ("replica-1", "replica-2")
    try:
        for name in replicas:
            deployment.start_beat(name)
        deployment.wait_ready()
        tasks = _clocked_tasks(make_task, PURGED, "purged", in_seconds=2)
        dispatched = Run.objects.filter(periodic_task__in=tasks, status=Run.Status.DISPATCHED)
        wait_until(lambda: dispatched.count() == PURGED, timeout=60)
        # committed dispatched only once the broker took the message: all 30 wait there
        assert queues.waiting(deployment.queue) == PURGED
        assert queues.purge(deployment.queue) == PURGED
        assert queues.waiting(deployment.queue) == 0
        # nothing re-published yet: what comes now replaces what the purge lost
        assert Run.objects.filter(periodic_task__in=tasks, republished__gt=0).count() == 0

        deployment.start_worker("worker-1", concurrency=2)
        deployment.wait_ready("worker-1")
        ready = ledger.database_now()
        succeeded = Run.objects.filter(periodic_task__in=tasks, status=Run.Status.SUCCEEDED)
        limit_passed = (1 + REPUBLISH_LIMIT) * (PURGE_DEADLINE + PURGE_RECONCILE + TICK)
        wait_until(lambda: succeeded.count() == PURGED, timeout=limit_passed + 30)
        # every copy published reached the guard: the purged ones are gone, the others were
        # executed (one per run) or dropped as duplicates
        wait_until(lambda: _deliveries() == _republished(tasks), timeout=30)
        wait_until(lambda: queues.waiting(deployment.queue) == 0, timeout=30)
    finally:
        deployment.stop()

    runs = _runs(tasks)
    ended = Counter(e["task_id"] for e in deployment.executions())
    assert ended == {run.task_id: 1 for run in runs}  # each exactly once, by the worker's log
    assert len(runs) == PURGED
    deadline = timedelta(seconds=PURGE_DEADLINE)
    pass_and_tick, slack = timedelta(seconds=PURGE_RECONCILE + TICK), timedelta(seconds=SLACK)
    for run in runs:
        assert run.claimed_by in replicas
        assert (run.status, run.executions) == (Run.Status.SUCCEEDED, 1)
        assert 1 <= run.republished <= REPUBLISH_LIMIT
        assert run.suppressed == run.republished - 1  # the purged message never came
        assert run.worker.startswith("worker-1@")
        # Each re-publish came once the deadline had passed since the previous publish (never
        # earlier), and within the deadline plus one reconcile pass (and a tick) of it. A second
        # one goes out only for a run still not started a deadline after the first (a busy
        # machine's slow drain); the last one was before the start, which it made possible.
        since_dispatch = run.republished_at - run.dispatched_at
        assert since_dispatch >= run.republished * deadline
        assert since_dispatch <= run.republished * (deadline + pass_and_tick) + slack
        assert run.dispatched_at < run.republished_at <= run.started_at
    total = sum(run.republished for run in runs)
    assert _log_count(deployment, "re-published run ", *replicas) == total
    first = min(r.dispatched_at for r in runs)
    print(
        f"purged {PURGED}; re-published {dict(Counter(r.republished for r in runs))} (times: "
        f"runs); worker ready {(ready - first).total_seconds():.1f} s and last start "
        f"{(max(r.started_at for r in runs) - first).total_seconds():.1f} s after the dispatch"
    )


CONCURRENCY = 2
PREFETCH_MULTIPLIER = 4
CUT = 10  # runs: held by the killed worker, or left waiting in the queue
CUT_SLEEP = 4.0
FAST_REDELIVERY = {  # Redis and the SQL transport redeliver what a dead worker held (RabbitMQ: at once)
    "CELERY_BROKER_VISIBILITY_TIMEOUT": "5",
    "CELERY_BROKER_RESTORE_INTERVAL": "1",
    "CELERY_BROKER_RESTORE_THROTTLE": "1",
}


@pytest.mark.parametrize("policy", [TaskPolicy.WorkerLost.RECOVER, TaskPolicy.WorkerLost.FAIL])
def test_a_worker_killed_with_runs_executing_and_prefetched(tmp_path, make_task, policy):
    """SIGKILL a worker (concurrency 2, prefetch multiplier 4) holding 8 runs, 2 of them mid-body
    (3 on kombu's SQL transport: see ``queues.worker_holds``).

    ``recover`` (the tasks' scheduling policy): every run executes to the end exactly once; the
    2 cut ones show a start without an end in the killed worker, then one full execution.
    ``fail`` (the global default): the 2 cut ones end "worker lost" when the broker redelivers
    them, and the prefetched ones, never started, still execute once, as do those left queued.
    """
    held = queues.worker_holds(CONCURRENCY, PREFETCH_MULTIPLIER)  # 2 executing, the rest reserved
    deployment = Deployment(
        tmp_path, CELERY_WORKER_PREFETCH_MULTIPLIER=str(PREFETCH_MULTIPLIER), **FAST_REDELIVERY
    )
    try:
        deployment.start_beat("replica-1")
        deployment.start_worker("worker-a", concurrency=CONCURRENCY)
        deployment.wait_ready()
        tasks = _clocked_tasks(
            make_task, CUT, f"cut-{policy}", in_seconds=2, sleep=CUT_SLEEP, log_start=True
        )
        if policy == TaskPolicy.WorkerLost.RECOVER:
            TaskPolicy.objects.bulk_create(
                TaskPolicy(periodic_task=task, worker_lost_policy=policy) for task in tasks
            )
        running = Run.objects.filter(periodic_task__in=tasks, status=Run.Status.RUNNING)
        wait_until(
            lambda: running.count() == CONCURRENCY
            and len(deployment.executions("start")) == CONCURRENCY
            and queues.waiting(deployment.queue) == CUT - held,
            timeout=60,
        )
        cut = {run.task_id for run in running}
        deployment.kill("worker-a")
        cut_starts = deployment.executions("start")
        assert deployment.executions() == []  # killed mid-body: no execution had ended
        assert {e["task_id"] for e in cut_starts} == cut and len(cut) == CONCURRENCY

        deployment.start_worker("worker-b", concurrency=CONCURRENCY)
        drain(timeout=90)
        wait_until(lambda: queues.waiting(deployment.queue) == 0, timeout=30)
    finally:
        deployment.stop()

    runs = {run.task_id: run for run in _runs(tasks)}
    started = Counter(e["task_id"] for e in deployment.executions("start"))
    ended = Counter(e["task_id"] for e in deployment.executions())
    killed_group = cut_starts[0]["pgid"]
    assert {e["pgid"] for e in cut_starts} == {killed_group}
    assert all(
        e["pgid"] != killed_group for e in deployment.executions("start")[len(cut_starts):]
    )
    others = set(runs) - cut
    assert len(runs) == CUT and len(others) == CUT - CONCURRENCY
    for task_id in others:  # prefetched by the killed worker or left queued: never started there
        run = runs[task_id]
        assert (run.status, run.executions, started[task_id]) == (Run.Status.SUCCEEDED, 1, 1)
        assert run.worker.startswith("worker-b@")
    if policy == TaskPolicy.WorkerLost.RECOVER:
        assert ended == {task_id: 1 for task_id in runs}  # every run ran to the end, once
        for task_id in cut:
            run = runs[task_id]
            assert started[task_id] == 2  # cut mid-body, then one full execution
            assert (run.status, run.executions, run.reason) == (
                Run.Status.SUCCEEDED, 2, Run.Reason.REEXECUTED
            )
            assert run.worker.startswith("worker-b@")
    else:
        assert ended == {task_id: 1 for task_id in others}  # the cut runs never ran again
        for task_id in cut:
            run = runs[task_id]
            assert started[task_id] == 1
            assert (run.status, run.reason, run.executions) == (
                Run.Status.FAILED, Run.Reason.WORKER_LOST, 1
            )
            assert run.error.startswith(
                "the worker running it died mid-run; the broker redelivered its message and it "
                "was not run again (worker-loss policy fail)"
            )
            assert run.suppressed >= 1
            assert run.worker.startswith("worker-a@")


BACKLOG = 200
BACKLOG_DEADLINE = 4.0
BACKLOG_RECONCILE = 1.0
#: Two re-publishes: at the third deadline the runs are closed "not delivered".
BACKLOG_LIMIT = 2
MOST_MESSAGES = BACKLOG * (1 + BACKLOG_LIMIT)


def test_a_backlog_behind_no_worker_holds_a_bounded_number_of_copies_and_runs_once(
    tmp_path, make_task
):
    """200 runs wait with no worker for three deadlines (SCHEDULING_REPUBLISH_LIMIT=2).

    Two re-publishes each, then the third deadline closes them failed, "not delivered": the
    broker holds exactly 200 x (1 + 2) = 600 messages, never more. The workers come back: the
    guard runs each closed, never executed run once (reason "delivered after it was closed as not
    delivered") and drops its two other copies: 600 deliveries, and the replicas' logs show 400
    re-publishes and 200 closes in all, nothing published for a closed run.
    """
    deployment = Deployment(
        tmp_path,
        SCHEDULING_DELIVERY_TIMEOUT=str(BACKLOG_DEADLINE),
        SCHEDULING_RECONCILE_INTERVAL=str(BACKLOG_RECONCILE),
        SCHEDULING_REPUBLISH_LIMIT=str(BACKLOG_LIMIT),
    )
    replicas = ("replica-1", "replica-2")
    seen: list[int] = []

    def closed_with_at_most_the_bound():
        seen.append(queues.waiting(deployment.queue))
        assert seen[-1] <= MOST_MESSAGES, f"{seen[-1]} messages for {BACKLOG} runs"
        return closed.count() == BACKLOG

    try:
        for name in replicas:
            deployment.start_beat(name)
        deployment.wait_ready()
        tasks = _clocked_tasks(make_task, BACKLOG, "backlog", in_seconds=3)
        runs = Run.objects.filter(periodic_task__in=tasks)
        closed = runs.filter(status=Run.Status.FAILED, reason=Run.Reason.NOT_DELIVERED)
        deadlines = (1 + BACKLOG_LIMIT) * (BACKLOG_DEADLINE + BACKLOG_RECONCILE + TICK + SLACK)
        wait_until(closed_with_at_most_the_bound, timeout=deadlines + 30, interval=0.2)
        assert seen[-1] == MOST_MESSAGES
        assert _republished(tasks) == BACKLOG * BACKLOG_LIMIT

        for name in ("worker-1", "worker-2"):
            deployment.start_worker(name, concurrency=2)
        succeeded = runs.filter(status=Run.Status.SUCCEEDED)
        wait_until(lambda: succeeded.count() == BACKLOG, timeout=90)
        wait_until(lambda: _deliveries() == MOST_MESSAGES, timeout=60)
        assert queues.waiting(deployment.queue) == 0
    finally:
        deployment.stop()

    runs = _runs(tasks)
    ended = Counter(e["task_id"] for e in deployment.executions())
    assert ended == {run.task_id: 1 for run in runs}  # each exactly once, by the workers' log
    assert len(runs) == BACKLOG
    assert Counter(
        (run.status, run.reason, run.executions, run.suppressed, run.republished, run.error)
        for run in runs
    ) == {
        (Run.Status.SUCCEEDED, Run.Reason.LATE_DELIVERY, 1, BACKLOG_LIMIT, BACKLOG_LIMIT, ""):
            BACKLOG
    }
    assert _log_count(deployment, "re-published run ", *replicas) == BACKLOG * BACKLOG_LIMIT
    assert _log_count(deployment, "failed: not delivered", *replicas) == BACKLOG
    print(f"most messages in the queue: {max(seen)} ({len(seen)} samples)")
