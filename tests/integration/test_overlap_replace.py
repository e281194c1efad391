"""Overlap policies replace and buffer_all on real PostgreSQL: what the claim writes, what the
release trigger (schema.sql's block ``release_buffered``) frees, and what the guard does with a
replaced run's delivery. With a worker and beat replicas: tests/acceptance/test_overlap_policies.py.
"""

from __future__ import annotations

import pytest

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import GRACE, make_due, unfinished_run

pytestmark = pytest.mark.django_db(transaction=True)


def _task(make_task, overlap: str, **policy):
    task = make_task(every=3600)
    TaskPolicy.objects.create(periodic_task=task, overlap_policy=overlap, **policy)
    return task


def _claim(recorder, revoked: list[list[str]] | None = None):
    return ledger.claim_and_dispatch(
        recorder, replica_id="test:1", batch_size=100, grace=GRACE,
        revoke=None if revoked is None else revoked.append,
    )


def _state(run: Run) -> tuple[str, str]:
    run.refresh_from_db()
    return run.status, run.reason


def test_replace_skips_a_run_not_started_and_dispatches_the_new_slot(make_task, recorder):
    task = _task(make_task, TaskPolicy.Overlap.REPLACE)
    old = unfinished_run(task, Run.Status.DISPATCHED)
    run = make_due(task)
    done = _claim(recorder)
    assert [(d.run_id, d.status, d.replaced) for d in done] == [(run.pk, "dispatched", 1)]
    assert recorder.task_ids == [run.task_id]
    run.refresh_from_db()
    assert _state(old) == (Run.Status.SKIPPED, f"replaced by the run of {run.scheduled_for.isoformat()}")
    assert old.finished_at is not None
    # Its message reaches a worker after all: the guard drops it.
    execution = ledger.begin_execution(
        old.task_id, "w1", retries=0, redelivered=False, exclusive=True
    )
    assert (execution.execute, execution.reason) == (False, "already skipped")
    old.refresh_from_db()
    assert (old.status, old.executions, old.suppressed) == (Run.Status.SKIPPED, 0, 1)


def test_replace_with_finish_waits_for_a_started_run_and_dispatches_after_its_outcome(
    make_task, recorder
):
    task = _task(make_task, TaskPolicy.Overlap.REPLACE)
    started = unfinished_run(task, Run.Status.RUNNING, guarded=True)
    run = make_due(task)
    revoked: list[list[str]] = []
    done = _claim(recorder, revoked)
    assert [(d.status, d.replaced) for d in done] == [(Run.Status.BUFFERED, 0)]
    assert (recorder.task_ids, revoked) == ([], [])
    assert _state(run) == (
        Run.Status.BUFFERED,
        f"buffered: waited for the run dispatched at {started.dispatched_at.isoformat()} to finish",
    )
    assert _state(started) == (Run.Status.RUNNING, "")
    assert ledger.record_finished(started.task_id, Run.Status.SUCCEEDED)
    assert _state(started) == (Run.Status.SUCCEEDED, "")  # its outcome kept
    assert [(d.run_id, d.status) for d in _claim(recorder)] == [(run.pk, "dispatched")]
    assert recorder.task_ids == [run.task_id]


def _terminating(make_task, recorder, status: str):
    """A replace task with terminate, a started run (``status``) and its next slot claimed:
    (the started run, the new run, what the claim returned, the task ids it revoked)."""
    task = _task(
        make_task, TaskPolicy.Overlap.REPLACE,
        replace_started=TaskPolicy.ReplaceStarted.TERMINATE,
    )
    started = unfinished_run(task, status, guarded=True)
    run = make_due(task)
    revoked: list[list[str]] = []
    return started, run, _claim(recorder, revoked), revoked


def test_replace_with_terminate_revokes_the_started_run_after_the_commit(make_task, recorder):
    started, run, done, revoked = _terminating(make_task, recorder, Run.Status.RUNNING)
    assert [(d.status, d.replaced) for d in done] == [(Run.Status.BUFFERED, 1)]
    assert revoked == [[started.task_id]]
    reason = f"replaced by the run of {run.scheduled_for.isoformat()}"
    assert _state(started) == (Run.Status.RUNNING, reason)
    # The worker's task_revoked(terminated=True) records it; the new run is released.
    assert ledger.record_finished(started.task_id, Run.Status.FAILED, "revoked (terminated)")
    started.refresh_from_db()
    assert (started.status, started.reason, started.error) == (
        Run.Status.FAILED, reason, "revoked (terminated)"
    )
    assert [(d.run_id, d.status) for d in _claim(recorder)] == [(run.pk, "dispatched")]


def test_a_newer_slot_replaces_the_run_waiting_behind_a_started_one(make_task, recorder):
    task = _task(make_task, TaskPolicy.Overlap.REPLACE)
    unfinished_run(task, Run.Status.RUNNING, guarded=True)
    first = make_due(task)
    _claim(recorder)
    assert _state(first)[0] == Run.Status.BUFFERED
    second = make_due(task)
    done = _claim(recorder)
    assert [(d.run_id, d.status, d.replaced) for d in done] == [(second.pk, "buffered", 1)]
    second.refresh_from_db()
    assert _state(first) == (
        Run.Status.SKIPPED, f"replaced by the run of {second.scheduled_for.isoformat()}"
    )
    assert list(Run.objects.filter(periodic_task=task, status="buffered")) == [second]


def test_replace_leaves_manual_runs_and_other_tasks_alone(make_task, recorder):
    task = _task(make_task, TaskPolicy.Overlap.REPLACE)
    other = make_task(every=3600)
    elsewhere = unfinished_run(other, Run.Status.DISPATCHED)
    manual = ledger.request_run(task, requested_by="op")
    done = _claim(recorder)
    assert [(d.run_id, d.status) for d in done] == [(manual.pk, "dispatched")]
    assert _state(elsewhere) == (Run.Status.DISPATCHED, "")


def test_buffer_all_buffers_every_slot_and_releases_them_in_slot_order(make_task, recorder):
    task = _task(make_task, TaskPolicy.Overlap.BUFFER_ALL, buffer_limit=2)
    busy = unfinished_run(task, Run.Status.RUNNING, guarded=True)
    waiting = []
    for _ in range(3):
        waiting.append(make_due(task))
        _claim(recorder)
    assert [_state(r)[0] for r in waiting] == ["buffered", "buffered", "skipped"]
    assert waiting[2].reason == "overlap: buffer full, 2 runs already wait (buffer all)"
    assert recorder.task_ids == []
    ran = []
    previous = busy
    for expected in waiting[:2]:
        assert ledger.record_finished(previous.task_id, Run.Status.SUCCEEDED)
        done = _claim(recorder)
        assert [(d.run_id, d.status) for d in done] == [(expected.pk, "dispatched")]
        ran.append(expected.scheduled_for)
        previous = expected
        Run.objects.filter(pk=expected.pk).update(status=Run.Status.RUNNING)
    assert ran == sorted(ran)
    assert _claim(recorder) == []


def test_buffer_all_keeps_slot_order_behind_waiting_runs_when_nothing_is_busy(make_task, recorder):
    task = _task(make_task, TaskPolicy.Overlap.BUFFER_ALL)
    busy = unfinished_run(task, Run.Status.RUNNING, guarded=True)
    older = make_due(task)
    _claim(recorder)
    newer = make_due(task)
    Run.objects.filter(pk=busy.pk).update(status=Run.Status.SUCCEEDED)  # releases `older`
    done = _claim(recorder)
    assert sorted((d.run_id, d.status) for d in done) == sorted(
        [(older.pk, "dispatched"), (newer.pk, "buffered")]
    )
    assert _state(newer) == (Run.Status.BUFFERED, "buffered: waited behind 1 earlier runs of this task")


def test_buffer_all_runs_released_while_paused_are_skipped_one_after_another(make_task, recorder):
    task = _task(make_task, TaskPolicy.Overlap.BUFFER_ALL)
    busy = unfinished_run(task, Run.Status.RUNNING, guarded=True)
    waiting = []
    for _ in range(3):
        waiting.append(make_due(task))
        _claim(recorder)
    assert [_state(r)[0] for r in waiting] == ["buffered"] * 3
    ledger.pause(task, by="ops", why="maintenance")
    assert ledger.record_finished(busy.task_id, Run.Status.SUCCEEDED)
    for _ in range(3):  # each released run, skipped by the pause, releases the next
        done = _claim(recorder)
        assert [d.status for d in done] == [Run.Status.SKIPPED]
    assert [_state(r) for r in waiting] == [(Run.Status.SKIPPED, "paused by ops: maintenance")] * 3
    assert not Run.objects.filter(periodic_task=task, buffered_at__isnull=False,
                                  status__in=["buffered", "pending"]).exists()
    assert recorder.task_ids == []


def test_a_retrying_run_replace_terminates_keeps_the_replaced_reason(make_task, recorder):
    retrying, run, _, revoked = _terminating(make_task, recorder, Run.Status.RETRYING)
    assert revoked == [[retrying.task_id]]
    # The worker drops the revoked retry's message (task_revoked, not terminated).
    assert ledger.record_not_executed(retrying.task_id, Run.Status.FAILED, Run.Reason.REVOKED)
    reason = f"replaced by the run of {run.scheduled_for.isoformat()}"
    assert _state(retrying) == (Run.Status.FAILED, reason)
    assert [(d.run_id, d.status) for d in _claim(recorder)] == [(run.pk, "dispatched")]
