"""The tasks' last_run_at/total_run_count written in batches by a replica (``ledger.TaskBook``)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django_celery_beat.models import PeriodicTask

from scheduling import ledger, slots
from scheduling.ledger.writes import insert_pending
from scheduling.models import Run
from scheduling.sql import queries
from tests.integration.conftest import GRACE

pytestmark = pytest.mark.django_db(transaction=True)


def _version(task: PeriodicTask) -> int:
    """The transaction id that wrote the task row's current version (a new one per UPDATE)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text::bigint FROM django_celery_beat_periodictask WHERE id = %s",
            [task.pk],
        )
        return int(cursor.fetchone()[0])


def _claim(recorder, book: ledger.TaskBook | None) -> list[ledger.Dispatched]:
    return ledger.claim_and_dispatch(
        recorder, replica_id="test:1", batch_size=100, grace=GRACE, book=book
    )


def _due_now(task: PeriodicTask) -> Run:
    ledger.reconcile(GRACE)
    run = Run.objects.pending().get(periodic_task=task)
    now = ledger.database_now()
    Run.objects.filter(pk=run.pk).update(
        scheduled_for=now, due_at=now, task_id=slots.task_id_for(task.pk, now)
    )
    run.refresh_from_db()
    return run


def test_a_claim_with_a_book_writes_no_version_of_the_task_row(make_task, recorder):
    task = make_task(every=3600, start_time=ledger.database_now() - timedelta(hours=2))
    book = ledger.TaskBook()
    run = _due_now(task)
    before = _version(task)

    assert [d.status for d in _claim(recorder, book)] == [Run.Status.DISPATCHED]
    assert _version(task) == before
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (None, 0)
    assert len(book) == 1

    assert book.flush() is True
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (run.scheduled_for, 1)
    assert len(book) == 0


def test_without_a_book_the_claim_writes_the_task_row(make_task, recorder):
    task = make_task(every=3600, start_time=ledger.database_now() - timedelta(hours=2))
    run = _due_now(task)
    before = _version(task)

    _claim(recorder, None)
    assert _version(task) != before
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (run.scheduled_for, 1)


def test_the_book_adds_up_claims_and_one_write_records_them_all(make_task, recorder):
    task = make_task(every=3600, start_time=ledger.database_now() - timedelta(hours=2))
    book = ledger.TaskBook()
    scheduled = []
    for _ in range(3):
        scheduled.append(_due_now(task).scheduled_for)
        _claim(recorder, book)
    assert len(recorder.messages) == 3
    book.flush()
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (max(scheduled), 3)


def test_a_claim_that_ends_a_schedule_writes_the_task_row_itself(make_task, recorder):
    """A one-off's run: ``enabled`` off with the commit, and its count with it, not in the book."""
    task = make_task(every=3600, start_time=ledger.database_now() - timedelta(hours=2))
    PeriodicTask.objects.filter(pk=task.pk).update(one_off=True)
    book = ledger.TaskBook()
    run = _due_now(task)

    _claim(recorder, book)
    task.refresh_from_db()
    assert (task.enabled, task.last_run_at, task.total_run_count) == (
        False, run.scheduled_for, 1
    )
    assert len(book) == 0


def test_the_book_writes_every_few_seconds(make_task, recorder):
    task = make_task(every=3600, start_time=ledger.database_now() - timedelta(hours=2))
    now = [100.0]
    book = ledger.TaskBook(clock=lambda: now[0])
    _due_now(task)
    _claim(recorder, book)

    now[0] += ledger.bookkeeping.EVERY - 0.5
    book.step()
    task.refresh_from_db()
    assert task.total_run_count == 0
    now[0] += 0.5
    book.step()
    task.refresh_from_db()
    assert task.total_run_count == 1


def test_a_write_that_fails_keeps_what_is_owed(make_task, recorder, raw_connection, caplog):
    """The task row locked elsewhere past the statement timeout: logged, kept, written later."""
    task = make_task(every=3600, start_time=ledger.database_now() - timedelta(hours=2))
    book = ledger.TaskBook()
    run = _due_now(task)
    _claim(recorder, book)
    with raw_connection.transaction():
        raw_connection.execute(
            "SELECT id FROM django_celery_beat_periodictask WHERE id = %s FOR UPDATE", [task.pk]
        )
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = '200ms'")
        try:
            assert book.flush() is False
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET statement_timeout = 0")
    assert [r.action for r in caplog.records if hasattr(r, "action")
            and r.action.startswith("bookkeeping")] == ["bookkeeping_failed"]
    assert len(book) == 1
    assert book.flush() is True
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (run.scheduled_for, 1)


def test_a_replica_writes_its_book_at_a_clean_stop(make_task):
    from project.celery import app
    from scheduling.schedulers import LedgerScheduler

    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start)
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()
    scheduler.tick()
    assert Run.objects.get(periodic_task=task, scheduled_for=start).status == (
        Run.Status.DISPATCHED
    )
    task.refresh_from_db()
    assert task.total_run_count == 0  # owed, within the book's few seconds
    scheduler.close()
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (start, 1)


def test_locking_tasks_to_update_them_leaves_other_transactions_foreign_key_checks_alone(
    make_task, raw_connection
):
    """A claim's (or a pass's) new runs are checked against their task rows at COMMIT (Django's
    foreign keys are deferred), a FOR KEY SHARE lock each, in the runs' order. A bookkeeping
    write holding some of those tasks must not make the COMMIT wait: with FOR UPDATE it did,
    and a claim deadlocked with a replica's bookkeeping (the claim rolled back after its
    messages went out, and its runs were published again)."""
    task = make_task(every=3600)
    raw_connection.execute(queries["lock_tasks"], [[task.pk]])  # held: raw_connection's transaction
    start = time.monotonic()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        assert insert_pending([(task, ledger.database_now() + timedelta(hours=1))]) == 1
    assert time.monotonic() - start < 4.0
    raw_connection.rollback()
    assert Run.objects.pending().filter(periodic_task=task).count() == 1
