"""The tasks' last_run_at/total_run_count: owed by each claim, settled by any replica
(``ledger.TaskBook``, ``OwedRunCount``)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import PeriodicTask

from scheduling import ledger, slots
from scheduling.exceptions import PublishFailed
from scheduling.ledger.writes import insert_pending
from scheduling.models import OwedRunCount, Run
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


def _owed() -> list[tuple[int, int, datetime]]:
    """The owed rows, oldest first: (task id, runs, newest slot)."""
    rows = OwedRunCount.objects.order_by("id")
    return list(rows.values_list("periodic_task_id", "runs", "last_slot"))


def _owe(task: PeriodicTask, runs: int, last_slot: datetime) -> None:
    OwedRunCount.objects.create(periodic_task_id=task.pk, runs=runs, last_slot=last_slot)


def _book(task: PeriodicTask) -> tuple[datetime | None, int]:
    task.refresh_from_db()
    return task.last_run_at, task.total_run_count


def _hour_task(make_task) -> PeriodicTask:
    return make_task(every=3600, start_time=ledger.database_now() - timedelta(hours=2))


def test_a_claim_with_a_book_owes_its_runs_and_writes_no_version_of_the_task_row(
    make_task, recorder
):
    task = _hour_task(make_task)
    run = _due_now(task)
    before = _version(task)

    assert [d.status for d in _claim(recorder, ledger.TaskBook())] == [Run.Status.DISPATCHED]
    assert _version(task) == before
    assert _book(task) == (None, 0)
    assert _owed() == [(task.pk, 1, run.scheduled_for)]

    assert ledger.TaskBook().settle() == 1  # any replica's book: the claim's replica may be dead
    assert _book(task) == (run.scheduled_for, 1)
    assert _owed() == []


def test_a_claim_owes_in_one_statement_however_many_tasks_it_ran(make_task, recorder):
    """The claim's cost: one INSERT (one row per task), and no write of a task row."""
    tasks = [_hour_task(make_task) for _ in range(5)]
    slots_by_task = {task.pk: _due_now(task).scheduled_for for task in tasks}
    with CaptureQueriesContext(connection) as captured:
        assert len(_claim(recorder, ledger.TaskBook())) == 5
    statements = [query["sql"] or "" for query in captured]
    assert [s.split()[0] for s in statements if "scheduling_owedruncount" in s] == ["INSERT"]
    assert [s for s in statements if "django_celery_beat_periodictask" in s
            and "scheduling_run" not in s] == []
    assert sorted(_owed()) == sorted((pk, 1, slot) for pk, slot in slots_by_task.items())


def test_a_claim_rolled_back_owes_nothing(make_task):
    """The owed row commits with the dispatches it counts, or not at all."""
    task = _hour_task(make_task)
    _due_now(task)

    def refused(message) -> None:
        raise PublishFailed("the broker is down")

    with pytest.raises(PublishFailed):
        _claim(refused, ledger.TaskBook())
    assert Run.objects.pending().filter(periodic_task=task).count() == 1
    assert _owed() == []


def test_without_a_book_the_claim_writes_the_task_row(make_task, recorder):
    task = _hour_task(make_task)
    run = _due_now(task)
    before = _version(task)

    _claim(recorder, None)
    assert _version(task) != before
    assert _book(task) == (run.scheduled_for, 1)
    assert _owed() == []


def test_a_claim_never_moves_last_run_at_back(make_task, recorder):
    """Stock beat left a later last_run_at (its send time): the claim's older slot keeps it."""
    task = _hour_task(make_task)
    run = _due_now(task)
    later = run.scheduled_for + timedelta(minutes=5)
    PeriodicTask.objects.filter(pk=task.pk).update(last_run_at=later)

    _claim(recorder, None)
    assert _book(task) == (later, 1)


def test_one_settle_adds_up_every_claim(make_task, recorder):
    task = _hour_task(make_task)
    book = ledger.TaskBook()
    scheduled = []
    for _ in range(3):
        scheduled.append(_due_now(task).scheduled_for)
        _claim(recorder, book)
    assert len(recorder.messages) == 3
    assert [(pk, runs) for pk, runs, _ in _owed()] == [(task.pk, 1)] * 3
    assert book.settle() == 1
    assert _book(task) == (max(scheduled), 3)


def test_a_claim_that_ends_a_schedule_writes_the_task_row_itself(make_task, recorder):
    """A one-off's run: ``enabled`` off with the commit, and its count with it, owed nothing."""
    task = _hour_task(make_task)
    PeriodicTask.objects.filter(pk=task.pk).update(one_off=True)
    run = _due_now(task)

    _claim(recorder, ledger.TaskBook())
    task.refresh_from_db()
    assert (task.enabled, task.last_run_at, task.total_run_count) == (
        False, run.scheduled_for, 1
    )
    assert _owed() == []


def test_the_settle_sums_per_task_and_never_moves_last_run_at_back(make_task):
    first, second, gone = (_hour_task(make_task) for _ in range(3))
    now = ledger.database_now().replace(microsecond=0)
    PeriodicTask.objects.filter(pk=first.pk).update(last_run_at=now, total_run_count=40)
    _owe(first, 2, now - timedelta(seconds=10))  # older than what the row says: kept
    _owe(second, 1, now - timedelta(seconds=5))
    _owe(first, 3, now - timedelta(seconds=20))
    _owe(second, 4, now + timedelta(seconds=5))
    _owe(gone, 7, now)
    PeriodicTask.objects.filter(pk=gone.pk).delete()

    assert ledger.TaskBook().settle() == 2
    assert _book(first) == (now, 45)
    assert _book(second) == (now + timedelta(seconds=5), 5)
    assert _owed() == []  # the deleted task's rows too
    assert ledger.TaskBook().settle() == 0


def test_two_settles_at_once_count_each_owed_row_once(make_task, raw_connection):
    """A settle skips the rows another holds (SKIP LOCKED); a settle rolled back leaves its rows
    owed for the next."""
    held, free = _hour_task(make_task), _hour_task(make_task)
    slot = ledger.database_now().replace(microsecond=0)
    _owe(held, 2, slot)
    raw_connection.execute(queries["settle_run_counts"])  # its transaction: the rows locked
    _owe(free, 3, slot)

    assert ledger.TaskBook().settle() == 1
    assert (_book(held), _book(free)) == ((None, 0), (slot, 3))
    raw_connection.rollback()
    assert _owed() == [(held.pk, 2, slot)]

    raw_connection.execute(queries["settle_run_counts"])
    assert ledger.TaskBook().settle() == 0
    raw_connection.commit()
    assert (_book(held), _book(free)) == ((slot, 2), (slot, 3))
    assert _owed() == []


def test_a_settle_does_not_see_an_uncommitted_claims_rows(make_task, raw_connection):
    task = _hour_task(make_task)
    slot = ledger.database_now().replace(microsecond=0)
    raw_connection.execute(
        "INSERT INTO scheduling_owedruncount (periodic_task_id, runs, last_slot)"
        " VALUES (%s, 1, %s)", [task.pk, slot],
    )
    assert ledger.TaskBook().settle() == 0
    raw_connection.commit()
    assert ledger.TaskBook().settle() == 1
    assert _book(task) == (slot, 1)


def test_the_book_settles_at_its_first_step_then_once_a_cadence(make_task, recorder):
    task = _hour_task(make_task)
    now = [100.0]
    book = ledger.TaskBook(clock=lambda: now[0])
    _owe(task, 5, ledger.database_now())  # a killed replica's
    book.step()
    assert _book(task)[1] == 5

    _due_now(task)
    _claim(recorder, book)
    now[0] += ledger.bookkeeping.EVERY - 0.5
    book.step()
    assert _book(task)[1] == 5
    now[0] += 0.5
    book.step()
    assert _book(task)[1] == 6


def test_a_settle_that_fails_leaves_what_is_owed(make_task, recorder, raw_connection, caplog):
    """The task row locked elsewhere past the statement timeout: logged, owed, settled later."""
    task = _hour_task(make_task)
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
            assert book.settle() is None
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET statement_timeout = 0")
    assert [r.action for r in caplog.records if hasattr(r, "action")
            and r.action.startswith("bookkeeping")] == ["bookkeeping_failed"]
    assert _owed() == [(task.pk, 1, run.scheduled_for)]
    assert book.settle() == 1
    assert _book(task) == (run.scheduled_for, 1)


def test_a_replica_settles_at_a_clean_stop(make_task):
    from project.celery import app
    from scheduling.schedulers import LedgerScheduler

    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # its first settle: nothing owed yet
    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start)
    dispatched = Run.objects.filter(
        periodic_task=task, scheduled_for=start, status=Run.Status.DISPATCHED
    )
    for _ in range(5):  # the edit's reconcile plans the run, a claim dispatches it
        scheduler.tick()
        if dispatched.exists():
            break
    assert dispatched.exists()
    assert _book(task) == (None, 0)  # owed, within the book's cadence
    assert _owed() == [(task.pk, 1, start)]
    scheduler.close()
    assert _book(task) == (start, 1)


def test_locking_tasks_to_update_them_leaves_other_transactions_foreign_key_checks_alone(
    make_task, raw_connection
):
    """A claim's (or a pass's) new runs are checked against their task rows at COMMIT (Django's
    foreign keys are deferred), a FOR KEY SHARE lock each, in the runs' order. A bookkeeping
    write holding some of those tasks must not make the COMMIT wait: with FOR UPDATE it did,
    and a claim deadlocked with a replica's bookkeeping (the claim rolled back after its
    messages went out, and its runs were published again)."""
    task = make_task(every=3600)
    raw_connection.execute(  # held: raw_connection's transaction
        queries["update_tasks"], [[task.pk], [None], [0], [False]]
    )
    start = time.monotonic()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        assert insert_pending([(task, ledger.database_now() + timedelta(hours=1))]) == 1
    assert time.monotonic() - start < 4.0
    raw_connection.rollback()
    assert Run.objects.pending().filter(periodic_task=task).count() == 1
