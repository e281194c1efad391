"""Invariant 3 with real workers: at most one execution per run, retries, a killed worker.

Issue 4, acceptance 1-3. Each test runs one beat replica and real ``celery worker`` processes;
executions are counted from the workers' own log (``project.tasks.record``), not the ledger.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import (
    Deployment,
    broker_task_ids,
    wait_until,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def _run_in(task, *statuses: str, timeout: float = 30.0) -> Run:
    return wait_until(
        lambda: Run.objects.filter(periodic_task=task, status__in=statuses).first(), timeout
    )


def _clocked(make_task, name: str, seconds: float = 2.0, **kwargs: object):
    return make_task(
        clocked=ledger.database_now() + timedelta(seconds=seconds),
        name=name,
        kwargs=json.dumps({"label": name, **kwargs}),
    )


def _suppressed_lines(deployment: Deployment, *workers: str) -> int:
    return sum(
        deployment.log_path(w).read_text().count("duplicate delivery suppressed") for w in workers
    )


def test_a_run_published_before_during_and_after_its_execution_runs_once(
    deployment: Deployment, make_task
):
    """Acceptance 1: three extra copies of a scheduled run's message; the body runs once."""
    deployment.start_beat("replica-1")
    deployment.wait_ready()
    task = _clocked(make_task, "dup", sleep=3)
    run = _run_in(task, Run.Status.DISPATCHED)
    deployment.publish_copy(run)  # before: two copies wait for the workers
    deployment.start_worker("worker-1", concurrency=1)
    deployment.start_worker("worker-2", concurrency=1)
    _run_in(task, Run.Status.RUNNING, timeout=60)
    deployment.publish_copy(run)  # during: the first execution sleeps 3 s
    _run_in(task, Run.Status.SUCCEEDED)
    deployment.publish_copy(run)  # after
    wait_until(lambda: Run.objects.get(pk=run.pk).suppressed == 3, timeout=30)
    time.sleep(1)  # anything else still on its way would land now

    run.refresh_from_db()
    assert (run.status, run.executions, run.suppressed, run.retries) == (
        Run.Status.SUCCEEDED, 1, 3, 0
    )
    assert [e["task_id"] for e in deployment.executions()] == [run.task_id]
    assert _suppressed_lines(deployment, "worker-1", "worker-2") == 3
    assert broker_task_ids(deployment.queue, waiting_only=True) == []  # every copy acknowledged
    assert Run.objects.filter(periodic_task=task).count() == 1


def test_a_task_that_retries_twice_runs_three_times_as_one_run(deployment: Deployment, make_task):
    """Acceptance 3: self.retry() twice, then success: three executions, one run, succeeded."""
    deployment.start_beat("replica-1")
    deployment.start_worker("worker-1", concurrency=2)
    deployment.wait_ready()
    task = _clocked(make_task, "flaky", retry_times=2)
    run = _run_in(task, Run.Status.SUCCEEDED, timeout=60)

    executions = [e for e in deployment.executions() if e["task_id"] == run.task_id]
    assert [e["retries"] for e in executions] == [0, 1, 2]
    assert (run.status, run.executions, run.retries, run.suppressed) == (
        Run.Status.SUCCEEDED, 3, 2, 0
    )
    assert Run.objects.filter(periodic_task=task).count() == 1


FAST_REDELIVERY = {
    "CELERY_BROKER_VISIBILITY_TIMEOUT": "5",
    "CELERY_BROKER_RESTORE_INTERVAL": "1",
    "CELERY_BROKER_RESTORE_THROTTLE": "1",
}


def test_a_worker_killed_mid_run_is_replaced_and_the_run_executes_once_more(tmp_path, make_task):
    """Acceptance 2: SIGKILL mid-task with acks_late; the broker redelivers; another worker runs it.

    Redis after its visibility timeout; the serviceless SQL broker (``project.broker``) likewise.
    The task's worker-loss policy is ``recover``: under the default, ``fail``, the redelivery
    closes the run "worker lost" instead (``test_delivery.py`` covers both).
    """
    deployment = Deployment(tmp_path, **FAST_REDELIVERY)
    try:
        deployment.start_beat("replica-1")
        deployment.start_worker("worker-a", concurrency=1)
        deployment.wait_ready()
        task = _clocked(make_task, "killed", sleep=3, log_start=True)
        TaskPolicy.objects.create(
            periodic_task=task, worker_lost_policy=TaskPolicy.WorkerLost.RECOVER
        )
        run = _run_in(task, Run.Status.RUNNING, timeout=60)
        assert run.worker.startswith("worker-a@")
        # Mid-run is once the body has begun: the guard records the run running just before the
        # body writes its start line (seen killed in between, with no start line, under load).
        wait_until(lambda: any(e["task_id"] == run.task_id
                               for e in deployment.executions("start")), timeout=30)
        deployment.kill("worker-a")
        deployment.start_worker("worker-b", concurrency=1)
        run = _run_in(task, Run.Status.SUCCEEDED, timeout=60)
        time.sleep(1)
        run.refresh_from_db()
    finally:
        deployment.stop()

    starts = [e for e in deployment.executions("start") if e["task_id"] == run.task_id]
    ends = [e for e in deployment.executions() if e["task_id"] == run.task_id]
    assert len(starts) == 2 and starts[0]["pid"] != starts[1]["pid"]
    assert [e["pid"] for e in ends] == [starts[1]["pid"]]
    assert (run.status, run.executions, run.suppressed) == (Run.Status.SUCCEEDED, 2, 0)
    assert run.worker.startswith("worker-b@")
    assert run.reason == "re-executed: redelivered, and the worker that ran it is gone"


def test_a_redelivery_while_the_run_executes_on_a_live_worker_is_suppressed(
    tmp_path, make_task
):
    """The visibility timeout passes during a long run: the redelivered copy is dropped."""
    deployment = Deployment(tmp_path, **FAST_REDELIVERY)
    try:
        deployment.start_beat("replica-1")
        deployment.start_worker("worker-a", concurrency=1)
        deployment.start_worker("worker-b", concurrency=1)
        deployment.wait_ready()
        task = _clocked(make_task, "long", sleep=9)
        run = _run_in(task, Run.Status.SUCCEEDED, timeout=60)
        time.sleep(1)
        run.refresh_from_db()
        log = "".join(deployment.log_path(w).read_text() for w in ("worker-a", "worker-b"))
    finally:
        deployment.stop()

    assert [e["task_id"] for e in deployment.executions()] == [run.task_id]
    assert (run.status, run.executions, run.suppressed) == (Run.Status.SUCCEEDED, 1, 1)
    assert "running on a live worker; retries=0, redelivered=True" in log


def test_expired_messages_and_unknown_task_names_end_their_runs(deployment: Deployment, make_task):
    """Lifecycle: a message expired before a worker took it; a task name the worker lacks."""
    deployment.start_beat("replica-1")
    deployment.wait_ready()
    stale = make_task(
        clocked=ledger.database_now() + timedelta(seconds=1), name="stale", expire_seconds=1
    )
    stale_run = _run_in(stale, Run.Status.DISPATCHED)
    unknown = make_task(every=3600, name="unknown", task="project.tasks.not_there")
    unknown_run = Run.objects.create(
        periodic_task=unknown, periodic_task_name=unknown.name, task=unknown.task,
        scheduled_for=ledger.database_now(), trigger=Run.Trigger.MANUAL,
        status=Run.Status.DISPATCHED, task_id="c0ffee00-0000-4000-8000-000000000001",
    )
    deployment.publish_copy(unknown_run)  # as a beat whose app knows the name would
    time.sleep(2)  # the stale message's expiry passes before any worker runs
    deployment.start_worker("worker-1", concurrency=1)

    stale_run = _run_in(stale, Run.Status.EXPIRED, timeout=60)
    assert stale_run.reason == "message expired before a worker took it"
    assert stale_run.executions == 0 and stale_run.finished_at is not None
    unknown_run = _run_in(unknown, Run.Status.FAILED, timeout=30)
    assert unknown_run.reason == "unknown task on the worker"
    assert unknown_run.error.startswith(
        "unknown task name 'project.tasks.not_there': not registered on worker worker-1@"
    )
    assert deployment.executions() == []
