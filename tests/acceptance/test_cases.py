"""Cases C11 and C12, and the worker's outcome records, with one replica and one worker.

One deployment runs for the whole module (36 s); the tests assert on what it recorded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from scheduling import ledger
from scheduling.models import Run
from tests.acceptance.deployment import Deployment

pytestmark = [pytest.mark.acceptance, pytest.mark.once]

RUN_SECONDS = 36


@dataclass
class Recorded:
    start: datetime
    stop: datetime
    tasks: dict[str, PeriodicTask]
    runs: dict[str, list[Run]]
    executions: list[dict[str, object]]


@pytest.fixture(scope="module")
def recorded(django_db_setup, django_db_blocker, tmp_path_factory) -> Recorded:
    with django_db_blocker.unblock():
        deployment = Deployment(tmp_path_factory.mktemp("cases"))
        try:
            deployment.start_beat("replica-1")
            deployment.start_worker("worker-c", concurrency=2)
            deployment.wait_ready()
            start = ledger.database_now()
            every = {s: IntervalSchedule.objects.get_or_create(every=s, period="seconds")[0]
                     for s in (1, 2, 5)}
            tasks = {
                "c11": PeriodicTask.objects.create(
                    name="c11", task="project.tasks.record", interval=every[5],
                    start_time=start + timedelta(seconds=1), expires=start + timedelta(seconds=31),
                ),
                "c12-a": PeriodicTask.objects.create(
                    name="c12-a", task="project.tasks.record", interval=every[1],
                    start_time=start + timedelta(days=1),
                ),
                "c12-b": PeriodicTask.objects.create(
                    name="c12-b", task="project.tasks.record", interval=every[1],
                ),
                "failing": PeriodicTask.objects.create(
                    name="failing", task="project.tasks.record", interval=every[2],
                    kwargs='{"label": "boom", "fail": true}',
                ),
            }
            time.sleep(RUN_SECONDS)
            deployment.stop("replica-1")
            stop = ledger.database_now()
            deadline = time.monotonic() + 30
            while Run.objects.filter(status__in=("dispatched", "running")).exists():
                assert time.monotonic() < deadline, "worker did not finish the dispatched runs"
                time.sleep(0.2)
            deployment.stop()
            for task in tasks.values():
                task.refresh_from_db()
            runs = {name: list(Run.objects.filter(periodic_task=task).order_by("scheduled_for"))
                    for name, task in tasks.items()}
            result = Recorded(start, stop, tasks, runs, deployment.executions())
        finally:
            deployment.stop()
            Run.objects.all().delete()
            PeriodicTask.objects.all().delete()
    return result


def test_c11_expires_stops_the_schedule_and_disables_the_task(recorded: Recorded):
    task = recorded.tasks["c11"]
    runs = recorded.runs["c11"]
    dispatched = [r for r in runs if r.dispatched_at is not None]
    assert [r.scheduled_for for r in dispatched] == [
        task.start_time + timedelta(seconds=5 * i) for i in range(6)
    ]
    assert all(r.dispatched_at < task.expires for r in dispatched)
    assert [r for r in runs if r.status == Run.Status.PENDING] == []
    assert task.enabled is False
    executed = [e for e in recorded.executions if e["periodic_task_name"] == "c11"]
    assert sorted(e["task_id"] for e in executed) == sorted(r.task_id for r in dispatched)


def test_c12_a_task_starting_tomorrow_waits_while_another_runs_every_second(recorded: Recorded):
    waiting = recorded.runs["c12-a"]
    assert [(r.scheduled_for, r.status) for r in waiting] == [
        (recorded.tasks["c12-a"].start_time, Run.Status.PENDING)
    ]
    every_second = [r for r in recorded.runs["c12-b"] if r.status != Run.Status.PENDING]
    slots = [r.scheduled_for for r in every_second]
    assert {b - a for a, b in zip(slots, slots[1:])} == {timedelta(seconds=1)}
    assert len(slots) >= RUN_SECONDS - 3
    assert max(r.lateness for r in every_second) < timedelta(seconds=1)
    assert {r.status for r in every_second} == {Run.Status.SUCCEEDED}


def test_worker_records_start_finish_and_host_of_each_run(recorded: Recorded):
    for run in recorded.runs["c12-b"]:
        if run.status == Run.Status.SUCCEEDED:
            assert run.worker.startswith("worker-c@")
            assert run.dispatched_at <= run.started_at <= run.finished_at


def test_a_failing_task_records_failed_with_its_error(recorded: Recorded):
    finished = [r for r in recorded.runs["failing"] if r.status != Run.Status.PENDING]
    assert len(finished) >= RUN_SECONDS // 2 - 2
    assert {(r.status, r.error) for r in finished} == {
        (Run.Status.FAILED, "RuntimeError: boom failed on purpose")
    }
