"""Overlap policy buffer_one on real PostgreSQL: the claim buffers one run behind the busy one,
skips the rest, and every path that ends the busy run frees the buffered one at once (schema.sql's
trigger ``release_buffered``): the worker's outcome, the lost-worker sweep, the delivery
deadline's close, an admin's update, and a claim buffering it at that very moment."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from prometheus_client import REGISTRY

from scheduling import ledger, metrics
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import claim, claim_in_flight, make_due, unfinished_run

pytestmark = pytest.mark.django_db(transaction=True)


def _buffer_task(make_task, stale: int | None = None):
    task = make_task(every=3600)
    TaskPolicy.objects.create(
        periodic_task=task, overlap_policy=TaskPolicy.Overlap.BUFFER_ONE,
        overlap_stale_seconds=stale,
    )
    return task


def _busy(task, status: str = Run.Status.RUNNING, age: float = 5.0) -> Run:
    """An unfinished manual run of ``task`` dispatched ``age`` s ago, started by the guard."""
    return unfinished_run(task, status, age, trigger=Run.Trigger.MANUAL, guarded=True)


def _buffered(make_task, recorder) -> tuple[Run, Run]:
    """A buffer_one task with a busy run and a run the claim buffered behind it."""
    task = _buffer_task(make_task)
    busy = _busy(task)
    run = make_due(task)
    claim(recorder)
    run.refresh_from_db()
    assert (run.status, run.reason) == (
        Run.Status.BUFFERED,
        f"buffered: waited for the run dispatched at {busy.dispatched_at.isoformat()} to finish",
    )
    assert recorder.messages == []
    return busy, run


def _released(run: Run, buffered_at) -> None:
    """The run is pending again, due after it was buffered, its buffered_at kept."""
    run.refresh_from_db()
    assert run.status == Run.Status.PENDING
    assert run.buffered_at == buffered_at
    assert run.due_at > buffered_at
    assert run.finished_at is None and run.dispatched_at is None


def test_the_first_run_due_while_busy_waits_and_the_next_slot_is_still_planned(
    make_task, recorder
):
    busy, run = _buffered(make_task, recorder)
    assert run.buffered_at is not None and run.finished_at is None
    following = Run.objects.pending().get(periodic_task=run.periodic_task)
    assert following.scheduled_for == run.scheduled_for + timedelta(hours=1)


def test_further_slots_are_skipped_while_one_run_waits(make_task, recorder):
    busy, run = _buffered(make_task, recorder)
    following = make_due(run.periodic_task)
    claim(recorder)
    following.refresh_from_db()
    assert (following.status, following.reason) == (
        Run.Status.SKIPPED,
        f"overlap: a run already waits for the run dispatched at {busy.dispatched_at.isoformat()}",
    )
    assert Run.objects.filter(periodic_task=run.periodic_task, status="buffered").get() == run
    assert recorder.messages == []


def test_the_worker_outcome_frees_it_and_the_next_claim_dispatches_it_once(make_task, recorder):
    busy, run = _buffered(make_task, recorder)
    assert ledger.record_finished(busy.task_id, Run.Status.SUCCEEDED)
    _released(run, run.buffered_at)
    done = claim(recorder)
    assert [(d.run_id, d.status) for d in done] == [(run.pk, Run.Status.DISPATCHED)]
    assert recorder.task_ids == [run.task_id]
    run.refresh_from_db()
    assert run.status == Run.Status.DISPATCHED
    assert run.reason.startswith("buffered: waited for the run dispatched at ")
    assert run.lateness is not None and run.lateness >= timedelta(0)
    # Its next slot was planned when it was buffered: still exactly one pending scheduled run.
    pending = Run.objects.pending().filter(periodic_task=run.periodic_task)
    assert [p.scheduled_for for p in pending] == [run.scheduled_for + timedelta(hours=1)]
    assert claim(recorder) == []


def test_the_lost_worker_sweep_frees_it(make_task, recorder):
    busy, run = _buffered(make_task, recorder)
    assert ledger.close_lost_executions(ledger.LostExecutions(after=0)) == [busy.task_id]
    busy.refresh_from_db()
    assert (busy.status, busy.reason) == (Run.Status.FAILED, "worker lost")
    _released(run, run.buffered_at)
    claim(recorder)
    assert recorder.task_ids == [run.task_id]


def test_the_delivery_deadline_close_frees_it(make_task, recorder, settings):
    task = _buffer_task(make_task)
    busy = _busy(task, Run.Status.DISPATCHED)
    run = make_due(task)
    claim(recorder)
    run.refresh_from_db()
    assert run.status == Run.Status.BUFFERED
    settings.SCHEDULING_REPUBLISH_LIMIT = 1
    Run.objects.filter(pk=busy.pk).update(
        republished=1, republished_at=ledger.database_now() - timedelta(seconds=301)
    )
    done = ledger.redeliver(ledger.Republisher(recorder))
    assert done.closed == [busy.task_id]
    _released(run, run.buffered_at)
    claim(recorder)
    assert recorder.task_ids == [run.task_id]


def test_an_admin_update_frees_it_and_a_run_still_busy_buffers_it_again(make_task, recorder):
    busy, run = _buffered(make_task, recorder)
    other = _busy(run.periodic_task, age=2.0)  # a second unfinished run (a manual one)
    Run.objects.filter(pk=busy.pk).update(status=Run.Status.CANCELLED)
    _released(run, run.buffered_at)
    claim(recorder)
    run.refresh_from_db()
    assert (run.status, run.reason) == (
        Run.Status.BUFFERED,
        f"buffered: waited for the run dispatched at {other.dispatched_at.isoformat()} to finish",
    )
    assert recorder.messages == []
    assert ledger.record_finished(other.task_id, Run.Status.FAILED, "boom")
    claim(recorder)
    assert recorder.task_ids == [run.task_id]


def test_a_run_finishing_while_a_claim_buffers_frees_it_after_that_claim_commits(
    make_task, recorder
):
    task = _buffer_task(make_task)
    busy = _busy(task)
    run = make_due(task)
    make_due(make_task(every=3600))  # a run to publish: claim_in_flight waits for a message
    with claim_in_flight(pause=1.5) as in_flight:
        # The claim read the busy run unfinished and holds the buffered run, uncommitted: the
        # outcome's trigger waits for that commit, then frees the run it committed.
        assert ledger.record_finished(busy.task_id, Run.Status.SUCCEEDED)
    statuses = {d.run_id: d.status for d in in_flight.outcome}
    assert statuses[run.pk] == Run.Status.BUFFERED
    run.refresh_from_db()
    assert run.status == Run.Status.PENDING and run.buffered_at is not None


def test_a_stale_busy_run_does_not_buffer(make_task, recorder):
    task = _buffer_task(make_task, stale=30)
    _busy(task, age=31)
    run = make_due(task)
    claim(recorder)
    assert Run.objects.get(pk=run.pk).status == Run.Status.DISPATCHED


def test_a_buffered_run_of_a_deleted_task_is_cancelled(make_task, recorder):
    busy, run = _buffered(make_task, recorder)
    run.periodic_task.delete()
    run.refresh_from_db()
    assert (run.status, run.periodic_task_id) == (Run.Status.PENDING, None)
    claim(recorder)
    run.refresh_from_db()
    assert (run.status, run.reason) == (Run.Status.CANCELLED, "periodic task deleted")


def test_other_tasks_finishing_runs_touch_no_buffered_run(make_task, recorder):
    busy, run = _buffered(make_task, recorder)
    elsewhere = _busy(make_task(every=3600))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scheduling_run SET status = 'succeeded' WHERE id = %s", [elsewhere.pk]
        )
    run.refresh_from_db()
    assert run.status == Run.Status.BUFFERED


def test_metrics_count_the_buffered_and_the_skipped_runs(make_task, recorder, metrics_served):
    task = _buffer_task(make_task)
    _busy(task)
    replica = f"replica-{uuid.uuid4().hex[:6]}"
    for _ in range(2):  # the first due run is buffered, the next skipped
        make_due(task)
        metrics.observe_claim(claim(recorder, replica_id=replica), replica, 0.004)
    labels = {"task": task.name, "replica": replica}
    assert REGISTRY.get_sample_value("scheduling_runs_buffered_total", labels) == 1.0
    assert REGISTRY.get_sample_value("scheduling_runs_skipped_total", labels) == 1.0
    assert REGISTRY.get_sample_value(
        "scheduling_runs_dispatched_total", {**labels, "trigger": "schedule"}
    ) is None


def test_the_admin_offers_the_policy_and_filters_buffered_runs(client, make_task, recorder):
    from django.contrib.auth.models import User
    from django.urls import reverse

    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    busy, run = _buffered(make_task, recorder)
    task_page = client.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[run.periodic_task_id])
    ).content.decode()
    assert '<option value="buffer_one" selected>' in task_page
    runs = reverse("admin:scheduling_run_changelist")
    listed = client.get(runs, {"status__exact": "buffered"}).content.decode()
    assert "?status__exact=buffered" in client.get(runs).content.decode()  # a filter choice
    assert reverse("admin:scheduling_run_change", args=[run.pk]) in listed
    assert reverse("admin:scheduling_run_change", args=[busy.pk]) not in listed
    assert "run-badge-buffered" in listed
