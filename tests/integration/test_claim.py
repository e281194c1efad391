"""The claim on real PostgreSQL: SKIP LOCKED between connections, concurrent planners."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django_celery_beat.models import PeriodicTask

from scheduling import ledger, slots
from scheduling.models import Run
from tests.integration.conftest import GRACE, claim, claim_in_flight

pytestmark = pytest.mark.django_db(transaction=True)


def _due_run(task: PeriodicTask, seconds_ago: float = 1.0) -> Run:
    slot = ledger.database_now() - timedelta(seconds=seconds_ago)
    return Run.objects.create(
        periodic_task=task,
        periodic_task_name=task.name,
        task=task.task,
        scheduled_for=slot,
        task_id=slots.task_id_for(task.pk, slot),
    )


def test_locked_run_is_skipped_then_claimed_after_rollback(make_task, raw_connection, recorder):
    task = make_task(every=3600)
    run = _due_run(task)

    with raw_connection.cursor() as cursor:
        cursor.execute("SELECT id FROM scheduling_run WHERE id = %s FOR UPDATE", [run.pk])
        assert cursor.fetchone() == (run.pk,)

        assert claim(recorder) == []
        assert recorder.messages == []
        assert Run.objects.get(pk=run.pk).status == Run.Status.PENDING

    raw_connection.rollback()

    dispatched = claim(recorder, replica_id="replica-b")
    assert [(d.run_id, d.status) for d in dispatched] == [(run.pk, Run.Status.DISPATCHED)]
    assert recorder.task_ids == [run.task_id]
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Run.Status.DISPATCHED, "replica-b")


def test_claim_transaction_holds_the_lock_until_it_commits(make_task, recorder):
    """A replica paused inside its claim keeps the run; a second replica gets nothing."""
    task = make_task(every=3600)
    run = _due_run(task)
    with claim_in_flight(replica_id="slow") as first:
        assert first.task_ids == [run.task_id]
        assert claim(recorder, replica_id="fast") == []
        assert recorder.messages == []

    assert [d.task_id for d in first.outcome] == [run.task_id]
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Run.Status.DISPATCHED, "slow")
    assert claim(recorder, replica_id="fast") == []


def test_concurrent_planners_leave_one_pending_run_per_task(make_task):
    tasks = [make_task(every=2 + i % 3) for i in range(20)]
    tasks += [make_task(cron="* * * * *") for _ in range(10)]
    tasks += [make_task(cron="*/5 * * * *", timezone="Europe/Berlin") for _ in range(10)]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def planner(offset: int) -> None:
        try:
            barrier.wait()
            # Different grace values make the planners disagree on slots for some tasks;
            # the one-pending-run-per-task constraint must still leave exactly one.
            ledger.plan_missing(GRACE + timedelta(seconds=offset * 7))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=planner, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    pending = Run.objects.pending().scheduled()
    assert pending.count() == len(tasks)
    assert sorted(pending.values_list("periodic_task_id", flat=True)) == sorted(t.pk for t in tasks)


def test_plan_twice_adds_nothing(make_task):
    task = make_task(every=10)
    ledger.plan_missing(GRACE)
    first = list(Run.objects.values_list("periodic_task_id", "scheduled_for", "task_id"))
    ledger.plan_missing(GRACE)
    assert list(Run.objects.values_list("periodic_task_id", "scheduled_for", "task_id")) == first
    assert first[0][0] == task.pk
    assert first[0][2] == slots.task_id_for(task.pk, first[0][1])


def test_dispatch_plans_the_following_slot_and_updates_the_task(make_task, recorder):
    anchor = ledger.database_now() - timedelta(seconds=2)
    task = make_task(every=5, start_time=anchor)
    run = _due_run(task, seconds_ago=0)
    Run.objects.filter(pk=run.pk).update(scheduled_for=anchor, task_id=slots.task_id_for(task.pk, anchor))
    run.refresh_from_db()
    claim(recorder)
    following = Run.objects.pending().get(periodic_task=task)
    assert following.scheduled_for == run.scheduled_for + timedelta(seconds=5)
    assert following.task_id == slots.task_id_for(task.pk, following.scheduled_for)
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (run.scheduled_for, 1)
    message = recorder.messages[0]
    assert (message.name, message.task) == (task.name, "project.tasks.record")
    assert message.options["headers"]["periodic_task_name"] == task.name
    assert message.options["headers"]["scheduled_for"] == run.scheduled_for.isoformat()
    assert message.options["task_id"] == run.task_id


def test_worker_adopts_a_run_whose_claim_rolled_back_after_publishing(make_task, recorder):
    """The message is out but the claim did not commit: the worker's start is the dispatch."""
    anchor = ledger.database_now() - timedelta(seconds=1)
    task = make_task(every=30, start_time=anchor)
    run = _due_run(task, seconds_ago=0)
    Run.objects.filter(pk=run.pk).update(
        scheduled_for=anchor, task_id=slots.task_id_for(task.pk, anchor)
    )
    run.refresh_from_db()

    assert ledger.record_started(run.task_id, "worker@host") is True
    run.refresh_from_db()
    assert (run.status, run.worker) == (Run.Status.RUNNING, "worker@host")
    assert run.dispatched_at == run.started_at
    assert run.reason.startswith("adopted by the worker")
    following = Run.objects.pending().get(periodic_task=task)
    assert following.scheduled_for == anchor + timedelta(seconds=30)
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (anchor, 1)

    assert claim(recorder) == []  # no replica re-publishes it
    assert ledger.record_finished(run.task_id, Run.Status.SUCCEEDED) is True
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED


def test_finish_of_an_unknown_or_pending_run_changes_nothing(make_task):
    task = make_task(every=30)
    run = _due_run(task)
    assert ledger.record_finished(run.task_id, Run.Status.SUCCEEDED) is False
    assert ledger.record_finished("no-such-id", Run.Status.SUCCEEDED) is False
    assert Run.objects.get(pk=run.pk).status == Run.Status.PENDING
