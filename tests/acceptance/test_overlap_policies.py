"""Overlap policies buffer_all and replace with real processes: two beat replicas, one worker with
room for two executions at once, tasks due more often than their body lasts.

What ran, and when, comes from the worker's own log (``project.tasks.record`` with ``log_start``:
a start line per execution, and an end line per execution that finished, each with the database
clock), checked against the ledger. Reasons and statuses are asserted exactly; what a slow machine
changes (how many slots came, waited, were skipped) only as orders and counts. Waits are generous
(``wait_until``); no duration is asserted. The last test kills replicas while they claim.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime, timedelta
from itertools import pairwise
from typing import NamedTuple

import pytest
from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import Deployment, broker_is_amqp, broker_is_redis, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

#: The error the worker records on a run revoked with terminate (``scheduling.worker``).
TERMINATED = "revoked (terminated)"
#: Unfinished statuses: a run the worker has yet to start or finish.
UNFINISHED = (Run.Status.DISPATCHED, Run.Status.RUNNING, Run.Status.RETRYING)


class Execution(NamedTuple):
    """One execution of a run by the worker's log (database clock); ``end`` None: no end line."""

    start: datetime
    end: datetime | None
    task_id: str
    pid: int


def _executions(deployment: Deployment, name: str) -> list[Execution]:
    """The executions of periodic task ``name`` by the worker's log, by start.

    Asserts first that no run started or ended twice, and that no run ended without a start.
    """
    starts = [e for e in deployment.executions("start") if e["periodic_task_name"] == name]
    ends = [e for e in deployment.executions() if e["periodic_task_name"] == name]
    started = Counter(e["task_id"] for e in starts)
    ended = Counter(e["task_id"] for e in ends)
    assert [i for i, n in started.items() if n > 1] == [], "a run started twice"
    assert [i for i, n in ended.items() if n > 1] == [], "a run ended twice"
    assert set(ended) <= set(started), "an end line without a start line"
    end_at = {e["task_id"]: datetime.fromisoformat(e["db_at"]) for e in ends}
    return sorted(
        Execution(datetime.fromisoformat(e["db_at"]), end_at.get(e["task_id"]), e["task_id"],
                  e["pid"])
        for e in starts
    )


def _create(name: str, every: int, body: float, **policy: object) -> PeriodicTask:
    """A task running ``project.tasks.record`` every ``every`` s for ``body`` s, with its policy
    (one transaction: no slot is claimed before the policy exists)."""
    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
    with transaction.atomic():
        task = PeriodicTask.objects.create(
            name=name, task="project.tasks.record", interval=interval, kwargs=_kwargs(name, body),
        )
        TaskPolicy.objects.create(periodic_task=task, **policy)
    return task


def _kwargs(label: str, sleep: float) -> str:
    return json.dumps({"label": label, "sleep": sleep, "log_start": True})


def _scheduled(task: PeriodicTask) -> list[Run]:
    """The task's scheduled runs by slot, less its next slot planned and not claimed (pending,
    never buffered: one at most) and the runs an edit of the schedule cancelled."""
    runs = (
        Run.objects.filter(periodic_task=task, trigger=Run.Trigger.SCHEDULE)
        .exclude(status=Run.Status.PENDING, buffered_at__isnull=True)
        .exclude(status=Run.Status.CANCELLED, reason=Run.Reason.SCHEDULE_EDITED)
        .order_by("scheduled_for")
    )
    return list(runs)


def _settle(deployment: Deployment, runs: QuerySet[Run]) -> None:
    """Stop the replicas, then wait until the worker ran what was dispatched and dropped the
    deliveries of the runs replaced after their message was out (a run released after the
    replicas stopped stays pending)."""
    deployment.stop("replica-1", "replica-2")
    unsettled = runs.filter(
        Q(status__in=UNFINISHED)
        | Q(status=Run.Status.SKIPPED, dispatched_at__isnull=False, suppressed=0)
    )
    wait_until(lambda: not unsettled.exists(), timeout=60, interval=0.2)
    time.sleep(0.5)


def _observed(
    deployment: Deployment, task: PeriodicTask, every: int
) -> tuple[list[Run], dict[str, Run], list[Execution], set[str]]:
    """The task's scheduled runs (consecutive slots), the same by task id, its executions by the
    worker's log and their task ids (each a run of those slots)."""
    scheduled = _scheduled(task)
    _consecutive(scheduled, every)
    ledger = {r.task_id: r for r in scheduled}
    executions = _executions(deployment, task.name)
    executed = {e.task_id for e in executions}
    assert executed <= set(ledger), "executed, not a scheduled slot of the task"
    return scheduled, ledger, executions, executed


def _consecutive(runs: list[Run], every: int) -> None:
    """The runs are the task's slots one after another: none missing in the ledger."""
    assert runs, "no run"
    gaps = [b.scheduled_for - a.scheduled_for for a, b in pairwise(runs)]
    assert set(gaps) <= {timedelta(seconds=every)}, gaps


def _one_at_a_time(spans: list[tuple[datetime, datetime, str]]) -> None:
    """(start, end, task id) by start: each starts after the one before it ended."""
    for (_, end, before), (start, _, after) in pairwise(spans):
        assert start > end, f"{after} started at {start}, before {before} ended at {end}"


def _in_slot_order(executions: list[Execution], ledger: dict[str, Run]) -> None:
    slots = [ledger[e.task_id].scheduled_for for e in executions]
    assert slots == sorted(slots) and len(set(slots)) == len(slots), slots


def _suppressed_lines(deployment: Deployment, task_ids: set[str]) -> int:
    """The worker guard's "duplicate delivery suppressed" lines naming one of ``task_ids``."""
    lines = deployment.log_path("worker-1").read_text(errors="replace").splitlines()
    return sum(
        1 for line in lines
        if "duplicate delivery suppressed" in line and any(i in line for i in task_ids)
    )


def _replaced_not_started(
    deployment: Deployment, runs: list[Run], executed: set[str], every: int
) -> list[Run]:
    """The runs replace ended before they started: skipped, replaced by the next slot's run,
    never executed; a worker's guard dropped the delivery of each whose message was out."""
    skipped = [r for r in runs if r.status == Run.Status.SKIPPED]
    for run in skipped:
        replacing = run.scheduled_for + timedelta(seconds=every)
        assert run.reason == Run.Reason.replaced(replacing), (run.scheduled_for, run.reason)
        assert run.task_id not in executed and run.executions == 0
        # published (dispatched, in the ledger or earlier in the replacing claim): dropped once
        assert run.suppressed == (run.dispatched_at is not None), (run.task_id, run.suppressed)
    sent = {r.task_id for r in skipped if r.dispatched_at is not None}
    assert _suppressed_lines(deployment, sent) == len(sent)
    return skipped


def _drain(deployment: Deployment, tasks: list[PeriodicTask], runs: QuerySet[Run]) -> None:
    """Move ``tasks`` to an hourly schedule with a 0.2 s body, wait until none of ``runs``
    waits, is unfinished or is due, then stop the replicas."""
    hourly, _ = IntervalSchedule.objects.get_or_create(every=1, period="hours")
    with transaction.atomic():
        for task in tasks:
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


def _start(deployment: Deployment) -> None:
    deployment.start_beat("replica-1")
    deployment.start_beat("replica-2")
    deployment.start_worker("worker-1", concurrency=2)
    deployment.wait_ready()


@pytest.mark.once
def test_buffer_all_runs_every_slot_once_in_slot_order_one_at_a_time_up_to_the_limit(
    deployment: Deployment,
):
    """Two tasks every second whose body takes 2.5 s: buffer_all with room for 100 waiting runs
    (none skipped) and with room for 2 (the slots past them skipped). Once a few executions
    ended, the schedules move an hour on and the bodies shorten, so the waiting runs drain
    quickly; the replicas stop once nothing waits."""
    _start(deployment)
    every = 1
    tasks = {
        limit: _create(f"buffer-all-{limit}", every, 2.5,
                       overlap_policy=TaskPolicy.Overlap.BUFFER_ALL, buffer_limit=limit)
        for limit in (100, 2)
    }
    runs = Run.objects.filter(periodic_task__in=tasks.values())

    def loaded() -> bool:
        ended = Counter(e["periodic_task_name"] for e in deployment.executions())
        capped = runs.filter(periodic_task=tasks[2], status=Run.Status.SKIPPED)
        return min(ended[t.name] for t in tasks.values()) >= 4 and capped.count() >= 2

    wait_until(loaded, timeout=120, interval=0.2)
    _drain(deployment, list(tasks.values()), runs)

    for limit, task in tasks.items():
        _, ledger, executions, executed = _observed(deployment, task, every)
        assert all(e.end is not None for e in executions), "an execution never ended"
        _one_at_a_time([(e.start, e.end, e.task_id) for e in executions])
        _in_slot_order(executions, ledger)

        skipped = {i for i, r in ledger.items() if r.status == Run.Status.SKIPPED}
        # every slot: executed exactly once, or skipped past the limit, never both
        assert executed | skipped == set(ledger) and not executed & skipped
        for task_id in executed:
            assert (ledger[task_id].status, ledger[task_id].executions) == (
                Run.Status.SUCCEEDED, 1
            )
        for task_id in skipped:
            run = ledger[task_id]
            assert run.reason == Run.Reason.buffer_limit(limit), run.reason
            assert (run.buffered_at, run.dispatched_at, run.suppressed) == (None, None, 0)

        # the runs that waited: behind the busy run (its dispatch named) or behind earlier slots
        dispatches = {r.dispatched_at for r in ledger.values() if r.dispatched_at is not None}
        why = {Run.Reason.buffered(at) for at in (*dispatches, None)}
        waited = [ledger[i] for i in executed if ledger[i].buffered_at is not None]
        for run in waited:
            assert run.reason in why or run.reason.startswith("buffered: waited behind "), (
                run.reason
            )
            assert run.dispatched_at > run.buffered_at
        assert len(waited) >= 3
        if limit == 100:
            assert skipped == set()
        else:
            assert len(skipped) >= 2


@pytest.mark.once
def test_replace_finish_skips_the_runs_not_started_and_lets_the_started_one_finish(
    deployment: Deployment,
):
    """A task every second whose body takes 2.5 s, overlap replace with replace_started finish."""
    _start(deployment)
    every = 1
    task = _create("replace-finish", every, 2.5, overlap_policy=TaskPolicy.Overlap.REPLACE,
                   replace_started=TaskPolicy.ReplaceStarted.FINISH)
    runs = Run.objects.filter(periodic_task=task)

    def loaded() -> bool:
        ended = [e for e in deployment.executions() if e["periodic_task_name"] == task.name]
        return len(ended) >= 3 and runs.filter(status=Run.Status.SKIPPED).count() >= 2

    wait_until(loaded, timeout=120, interval=0.2)
    _settle(deployment, runs)
    scheduled, ledger, executions, executed = _observed(deployment, task, every)
    assert all(e.end is not None for e in executions), "a started run did not finish"
    _one_at_a_time([(e.start, e.end, e.task_id) for e in executions])
    _in_slot_order(executions, ledger)
    for task_id in executed:  # every execution finished with its outcome
        assert (ledger[task_id].status, ledger[task_id].executions) == (Run.Status.SUCCEEDED, 1)

    skipped = _replaced_not_started(deployment, scheduled, executed, every)
    assert len(skipped) >= 2
    left = [r for r in scheduled if r.task_id not in executed and r.status != Run.Status.SKIPPED]
    # at most the run released after the replicas stopped, pending again
    assert [(r.status, r.buffered_at is not None) for r in left] in ([], [("pending", True)])

    # a run that waited waited for the one executing before it, which finished
    for before, after in pairwise(executions):
        run = ledger[after.task_id]
        if run.buffered_at is not None:
            assert run.reason == Run.Reason.buffered(ledger[before.task_id].dispatched_at)
            assert run.dispatched_at > ledger[before.task_id].finished_at


@pytest.mark.broker
@pytest.mark.skipif(
    not (broker_is_redis() or broker_is_amqp()),
    reason="replace_started terminate revokes through Celery's remote control, a broadcast that"
    " kombu's SQL transport does not carry (the replaced runs would finish): Redis or RabbitMQ",
)
def test_replace_terminate_revokes_the_started_run_and_runs_the_new_one_after_it_stopped(
    deployment: Deployment,
):
    """A task every 2 s whose body takes 5 s, overlap replace with replace_started terminate:
    each started run is revoked with SIGTERM when the next slot comes, and that slot's run starts
    once the worker recorded the revoked one failed."""
    _start(deployment)
    every = 2
    task = _create("replace-terminate", every, 5.0, overlap_policy=TaskPolicy.Overlap.REPLACE,
                   replace_started=TaskPolicy.ReplaceStarted.TERMINATE)
    runs = Run.objects.filter(periodic_task=task)
    terminated = runs.filter(status=Run.Status.FAILED, error=TERMINATED)

    wait_until(lambda: terminated.count() >= 2, timeout=120, interval=0.2)
    _settle(deployment, runs)  # the last run started, or dispatched, finishes
    scheduled, ledger, executions, executed = _observed(deployment, task, every)
    # the executions counted from the worker's log are the ledger's
    for run in ledger.values():
        assert run.executions == (run.task_id in executed), (run.task_id, run.executions)

    killed = {i for i, r in ledger.items() if r.status == Run.Status.FAILED}
    assert len(killed) >= 2
    for task_id in killed:
        run = ledger[task_id]
        replacing = run.scheduled_for + timedelta(seconds=every)
        assert (run.error, run.reason) == (TERMINATED, Run.Reason.replaced(replacing))
        assert task_id in executed
        # the run of the replacing slot waited until the worker recorded this one failed
        # (unless replaced in turn before it started); its reason says so unless it was
        # terminated in turn
        successor = next(r for r in ledger.values() if r.scheduled_for == replacing)
        if successor.status != Run.Status.SKIPPED:
            assert successor.buffered_at is not None
            if successor.status != Run.Status.FAILED:
                assert successor.reason == Run.Reason.buffered(run.dispatched_at)
            if successor.dispatched_at is not None:
                assert successor.dispatched_at > run.finished_at
    for execution in executions:
        run = ledger[execution.task_id]
        # terminated: started, never ended; every other execution finished and succeeded
        assert (execution.end is None) == (execution.task_id in killed), execution
        if execution.end is not None:
            assert run.status == Run.Status.SUCCEEDED
    # a terminated body's process stopped: it never wrote a line again
    lines = deployment.executions("start") + deployment.executions()
    for execution in executions:
        if execution.end is None:
            later = [e for e in lines if e["pid"] == execution.pid
                     and datetime.fromisoformat(e["db_at"]) > execution.start]
            assert later == [], (execution, later)

    # one body at a time: a terminated one ends when the worker recorded it failed
    spans = [(e.start, e.end or ledger[e.task_id].finished_at, e.task_id) for e in executions]
    _one_at_a_time(spans)
    _in_slot_order(executions, ledger)

    _replaced_not_started(deployment, scheduled, executed, every)
    left = [r for r in scheduled if r.task_id not in executed and r.status != Run.Status.SKIPPED]
    assert [(r.status, r.buffered_at is not None) for r in left] in ([], [("pending", True)])


@pytest.mark.once
def test_buffer_all_drains_with_replicas_killed_while_claiming(deployment: Deployment):
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
    _drain(deployment, [task], runs)
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
