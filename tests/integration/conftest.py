"""Integration fixtures and helpers: a real PostgreSQL (the test database), claims, due runs."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django_celery_beat.models import PeriodicTask

from scheduling import ledger, slots
from scheduling.models import Run, TaskPolicy
from scheduling.run_message import Message
from tests.pgbouncer import free_port

GRACE = timedelta(seconds=60)


class Recorder:
    """A publish callable that records messages instead of sending them."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def task_ids(self) -> list[str]:
        return [m.options["task_id"] for m in self.messages]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def metrics_served(settings) -> int:
    """Metrics recorded in this process, as by a replica serving them (``metrics.recording``):
    ``SCHEDULING_METRICS_PORT`` set to a free port, which a ``LedgerScheduler`` made in the test
    serves. Returns the port."""
    settings.SCHEDULING_METRICS_PORT = free_port()
    return settings.SCHEDULING_METRICS_PORT


def claim(publish, replica_id: str = "test:1", batch_size: int = 100):
    """Run one claim transaction with the product's defaults."""
    return ledger.claim_and_dispatch(
        publish, replica_id=replica_id, batch_size=batch_size, grace=GRACE
    )


def make_due(task) -> Run:
    """Plan the task's scheduled run (reconcile) and make it due now, on the task's slot grid.

    An interval task's grid moves back with its run: the run's slot and the grid's anchor
    (``start_time``, else ``date_changed``) move by the same amount, so the run stays a slot
    of its task and the next slot is one interval after it. A clocked run moves with its
    clocked time. Any other schedule's run becomes its latest slot at or before now (a cron's
    previous minute, say). The schedule-change triggers are off for that one UPDATE (this
    session only, ``session_replication_role``): it moves time, it is no edit to record.
    """
    ledger.reconcile(GRACE)
    run = Run.objects.pending().get(periodic_task=task)
    now = ledger.database_now()
    if task.interval_id is not None or task.clocked_id is not None:
        slot = now
    else:
        slot = _latest_slot_at_or_before(task, now)
    shift = slot - run.scheduled_for
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            "UPDATE django_celery_beat_periodictask SET start_time = start_time + %s,"
            " date_changed = date_changed + %s WHERE id = %s AND interval_id IS NOT NULL",
            [shift, shift, task.pk],
        )
        cursor.execute(
            "UPDATE django_celery_beat_clockedschedule SET clocked_time = clocked_time + %s"
            " WHERE id = %s",
            [shift, task.clocked_id],
        )
        cursor.execute(
            "UPDATE scheduling_run SET scheduled_for = %s, due_at = due_at + %s, task_id = %s"
            " WHERE id = %s",
            [slot, shift, slots.task_id_for(task.pk, slot), run.pk],
        )
    task.refresh_from_db()
    moved = Run.objects.get(pk=run.pk)
    if task.solar_id is None:  # a solar event's next one is computed from a minute after
        assert slots.next_run(task, moved.scheduled_for - timedelta(microseconds=1)) == slot
    return moved


def unfinished_run(
    task: PeriodicTask, status: str = Run.Status.RUNNING, age: float = 5.0, *,
    trigger: str = Run.Trigger.SCHEDULE, guarded: bool = False,
) -> Run:
    """An unfinished run of ``task`` (``status``: dispatched, running or retrying) dispatched
    ``age`` seconds ago on the database clock, with a task id of its own; ``guarded``: started by
    the worker guard (one execution) unless still dispatched."""
    now = ledger.database_now()
    return Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task,
        scheduled_for=now - timedelta(seconds=age), trigger=trigger, status=status,
        dispatched_at=now - timedelta(seconds=age), task_id=str(uuid.uuid4()),
        executions=1 if guarded and status != Run.Status.DISPATCHED else 0,
    )


def _latest_slot_at_or_before(task: PeriodicTask, now: datetime) -> datetime:
    """The task's latest slot at or before ``now``: looked for in a window going back from a
    minute, doubled until it holds one (a cron of weekdays on a Sunday), at most about a year."""
    back = timedelta(minutes=1)
    while back < timedelta(days=800):
        latest, following = None, slots.next_run(task, now - back)
        while following is not None and following <= now:
            latest, following = following, slots.next_run(task, following)
        if latest is not None:
            return latest
        back *= 2
    raise AssertionError(f"{task.name!r} has no slot in the two years before {now}")


@contextmanager
def claim_in_flight(replica_id: str = "slow", pause: float = 1.5) -> Iterator[Recorder]:
    """Run a claim in another thread (its own connection) that holds its transaction ``pause`` s.

    The claim runs inside an outer transaction, which sleeps ``pause`` s after the claim returned
    (published, ledger written) before it commits. Yields the claim's Recorder once it has
    published (the claim is then open, its rows locked); on exit waits for the claim to end.
    ``recorder.outcome`` is then what the claim returned, or the exception it raised.
    """
    recorder = Recorder()

    def replica() -> None:
        try:
            with transaction.atomic():
                recorder.outcome = ledger.claim_and_dispatch(  # type: ignore[attr-defined]
                    recorder, replica_id=replica_id, batch_size=10, grace=GRACE
                )
                time.sleep(pause)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            recorder.outcome = exc  # type: ignore[attr-defined]
        finally:
            connections.close_all()

    thread = threading.Thread(target=replica)
    thread.start()
    deadline = time.monotonic() + 10
    while not recorder.messages and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield recorder
    finally:
        thread.join(timeout=30)


def late_task(make_task, policy: str | None, *, grace: int | None = 5, limit: int = 100,
               late_by: float = 187.0, every: int = 30) -> tuple[PeriodicTask, datetime]:
    """An interval task (every 30 s) whose pending run is its start_time, ``late_by`` s ago.

    At the defaults slots S0..S6 are past the 5 s grace (S6 by 7 s) and S7 is 23 s ahead: a
    claim that comes up to 20 s after set-up (a loaded machine) still sees the same slots.
    """
    first = ledger.database_now() - timedelta(seconds=late_by)
    task = make_task(every=every, start_time=first)
    if policy is not None:
        TaskPolicy.objects.create(
            periodic_task=task, misfire_policy=policy, misfire_grace_seconds=grace,
            catch_up_limit=limit,
        )
    ledger.reconcile(GRACE)
    Run.objects.pending().filter(periodic_task=task).update(
        scheduled_for=first, task_id=slots.task_id_for(task.pk, first)
    )
    return task, first
