"""Overlap policy at claim time: skip while the previous run is unfinished, within a bound."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

from scheduling import ledger, slots
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import claim, make_due, unfinished_run

pytestmark = pytest.mark.django_db(transaction=True)



def _skip_task(make_task, stale: int | None = None):
    task = make_task(every=3600)
    TaskPolicy.objects.create(
        periodic_task=task, overlap_policy=TaskPolicy.Overlap.SKIP, overlap_stale_seconds=stale
    )
    return task


@pytest.mark.parametrize(
    "status", [Run.Status.DISPATCHED, Run.Status.RUNNING, Run.Status.RETRYING]
)
def test_skip_records_skipped_while_the_previous_run_is_unfinished(make_task, recorder, status):
    task = _skip_task(make_task)
    previous = unfinished_run(task, status)
    run = make_due(task)

    claim(recorder)

    run.refresh_from_db()
    assert run.status == Run.Status.SKIPPED
    assert run.reason == (
        f"overlap: the run dispatched at {previous.dispatched_at.isoformat()} is not finished"
    )
    assert run.finished_at is not None and run.dispatched_at is None
    assert recorder.messages == []
    following = Run.objects.pending().get(periodic_task=task)
    assert following.scheduled_for == slots.next_run(task, run.scheduled_for)
    assert following.scheduled_for > run.scheduled_for


def test_a_finished_previous_run_does_not_block(make_task, recorder):
    task = _skip_task(make_task)
    unfinished_run(task, Run.Status.SUCCEEDED)
    run = make_due(task)
    claim(recorder)
    assert Run.objects.get(pk=run.pk).status == Run.Status.DISPATCHED
    assert recorder.task_ids == [run.task_id]


def test_allow_dispatches_overlapping_runs(make_task, recorder):
    task = make_task(every=3600)
    TaskPolicy.objects.create(periodic_task=task, overlap_policy=TaskPolicy.Overlap.ALLOW)
    unfinished_run(task)
    run = make_due(task)
    claim(recorder)
    assert Run.objects.get(pk=run.pk).status == Run.Status.DISPATCHED


def test_a_stale_unfinished_run_no_longer_blocks_per_task_bound(make_task, recorder):
    task = _skip_task(make_task, stale=30)
    unfinished_run(task, age=31)
    run = make_due(task)
    claim(recorder)
    assert Run.objects.get(pk=run.pk).status == Run.Status.DISPATCHED


@override_settings(SCHEDULING_OVERLAP_STALE_SECONDS=20)
def test_the_global_staleness_bound_applies_without_a_per_task_one(make_task, recorder):
    blocked, free = _skip_task(make_task), _skip_task(make_task)
    unfinished_run(blocked, age=10)
    unfinished_run(free, age=21)
    runs = {t.pk: make_due(t) for t in (blocked, free)}
    claim(recorder)
    assert Run.objects.get(pk=runs[blocked.pk].pk).status == Run.Status.SKIPPED
    assert Run.objects.get(pk=runs[free.pk].pk).status == Run.Status.DISPATCHED


def test_manual_runs_are_not_subject_to_the_overlap_policy(make_task, recorder):
    task = _skip_task(make_task)
    unfinished_run(task)
    manual = ledger.request_run(task)
    claim(recorder)
    assert Run.objects.get(pk=manual.pk).status == Run.Status.DISPATCHED


def test_two_runs_of_a_skip_task_in_one_batch_dispatch_only_the_first(make_task, recorder):
    task = _skip_task(make_task)
    now = ledger.database_now()
    backfill = [
        Run.objects.create(
            periodic_task=task, periodic_task_name=task.name, task=task.task,
            scheduled_for=now - timedelta(hours=h), trigger=Run.Trigger.BACKFILL,
            task_id=str(uuid.uuid4()),
        )
        for h in (2, 1)
    ]
    claim(recorder)
    statuses = [Run.objects.get(pk=r.pk).status for r in backfill]
    assert statuses == [Run.Status.DISPATCHED, Run.Status.SKIPPED]
    assert Run.objects.get(pk=backfill[1].pk).reason == (
        "overlap: an earlier run of this task was dispatched in the same batch"
    )


def test_the_claim_costs_the_same_queries_for_two_tasks_or_eight(make_task, recorder):
    def queries(n: int) -> int:
        tasks = [_skip_task(make_task) for _ in range(n)]
        for task in tasks[::2]:
            unfinished_run(task)
        for task in tasks:
            make_due(task)
        with CaptureQueriesContext(connection) as captured:
            claim(recorder)
        return len(captured)

    assert queries(2) == queries(8)
