"""Issue 36, point 5: django-celery-beat's ``total_run_count`` and ``last_run_at`` follow the ledger
whatever happens to a replica (``ledger.TaskBook``, ``OwedRunCount``).

Real beat replicas and a worker run interval tasks due every second; replicas are SIGKILLed mid-run.
At every instant, for every task, ``total_run_count`` plus the runs owed to it is the number of
its dispatched scheduled runs; once the dispatching stops, a settle (a survivor's within its
cadence, ``bookkeeping.EVERY``, or a new replica's at its first tick) leaves ``total_run_count``
equal to that number and ``last_run_at`` equal to the newest dispatched slot.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from django.db import connection
from django_celery_beat.models import PeriodicTask

from scheduling.ledger import bookkeeping
from scheduling.models import Run
from tests.acceptance.deployment import Deployment, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.once, pytest.mark.django_db(transaction=True)]

#: Seconds any one state may take to come on a loaded machine (a replica starting, a claim).
WAIT = 60.0

Book = dict[int, tuple[int, int, int, datetime | None, datetime | None]]

# One statement, so one snapshot: each task's count, what is owed to it, its dispatched scheduled
# runs, and its last_run_at beside the newest dispatched slot.
_BOOK = """
SELECT t.id, t.total_run_count,
       COALESCE((SELECT sum(o.runs) FROM scheduling_owedruncount o
                 WHERE o.periodic_task_id = t.id), 0)::integer,
       (SELECT count(*) FROM scheduling_run r WHERE r.periodic_task_id = t.id
          AND r.trigger = 'schedule' AND r.dispatched_at IS NOT NULL)::integer,
       t.last_run_at,
       (SELECT max(r.scheduled_for) FROM scheduling_run r WHERE r.periodic_task_id = t.id
          AND r.trigger = 'schedule' AND r.dispatched_at IS NOT NULL)
FROM django_celery_beat_periodictask t WHERE t.id = ANY(%s) ORDER BY t.id
"""


def _book(tasks: list[PeriodicTask]) -> Book:
    """task id -> (total_run_count, owed runs, dispatched runs, last_run_at, newest slot)."""
    with connection.cursor() as cursor:
        cursor.execute(_BOOK, [[task.pk for task in tasks]])
        return {row[0]: tuple(row[1:]) for row in cursor.fetchall()}


def _nothing_lost(book: Book) -> None:
    """Counted plus owed is dispatched, for every task; last_run_at never past the newest slot."""
    assert {pk: (counted + owed, last <= newest if last else True)
            for pk, (counted, owed, _, last, newest) in book.items()} == {
        pk: (dispatched, True) for pk, (_, _, dispatched, _, _) in book.items()
    }


def _settled(book: Book) -> bool:
    return all(
        (counted, owed, last) == (dispatched, 0, newest)
        for counted, owed, dispatched, last, newest in book.values()
    )


def _run_then_stop(deployment: Deployment, make_task, seconds: float) -> list[PeriodicTask]:
    """Tasks due every second, dispatched for ``seconds`` by what runs, and the replica ``a``
    SIGKILLed just after one of its dispatches; then the tasks disabled and their last
    claims let through. Returns the tasks."""
    tasks = [make_task(every=1, name=f"every-1s-{i}") for i in range(4)]
    wait_until(lambda: Run.objects.filter(claimed_by="a").exists(), timeout=WAIT)
    time.sleep(seconds)
    offset = deployment.log_path("a").stat().st_size
    deployment.wait_for_log("a", "dispatched every-1s-", timeout=WAIT, after=offset)
    deployment.kill("a")
    _nothing_lost(_book(tasks))
    time.sleep(seconds)
    PeriodicTask.objects.filter(pk__in=[t.pk for t in tasks]).update(enabled=False)
    # A disabled task's due run is cancelled by the next claim; pending ones by a reconcile pass.
    wait_until(lambda: not Run.objects.pending().filter(periodic_task__in=tasks).exists(), WAIT)
    return tasks


def test_a_survivor_settles_what_a_killed_replica_owed_within_its_cadence(
    deployment: Deployment, make_task
):
    deployment.start_beat("a")
    deployment.start_beat("b")
    deployment.start_worker("worker", concurrency=2)
    deployment.wait_ready()

    tasks = _run_then_stop(deployment, make_task, seconds=4)
    book = _book(tasks)
    _nothing_lost(book)
    assert min(dispatched for _, _, dispatched, _, _ in book.values()) >= 4

    started = time.monotonic()
    wait_until(lambda: _settled(_book(tasks)), timeout=bookkeeping.EVERY + WAIT, interval=0.5)
    print(f"settled {time.monotonic() - started:.1f} s after the dispatching stopped: {book}")
    time.sleep(1)
    assert _settled(_book(tasks))  # and it stays so
    assert set(Run.objects.values_list("claimed_by", flat=True)) >= {"a", "b"}


def test_a_new_replica_settles_what_killed_replicas_owed_at_its_first_tick(
    deployment: Deployment, make_task
):
    deployment.start_beat("a")
    deployment.start_beat("b")
    deployment.wait_ready()

    tasks = _run_then_stop(deployment, make_task, seconds=3)
    deployment.kill("b")
    book = _book(tasks)
    _nothing_lost(book)
    print(f"owed when the last replica died: {book}")

    deployment.start_beat("c")
    deployment.wait_ready("c")
    wait_until(lambda: _settled(_book(tasks)), timeout=WAIT, interval=0.2)
    assert Run.objects.filter(claimed_by="c").count() == 0  # it dispatched nothing: it settled
