"""Runs outside the schedule: a manual run ("run now") and a backfill of past slots.

Both are rows of the ledger like scheduled runs, claimed and dispatched by the replicas exactly
once; neither moves the task's schedule.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django_celery_beat.models import PeriodicTask

from scheduling import slots
from scheduling.clock import database_now
from scheduling.exceptions import BackfillRejected, RunNowRefused
from scheduling.ledger.writes import definition_version, insert_runs, planned_run
from scheduling.models import Run, TaskHistory
from scheduling.timeformat import utc_text

logger = logging.getLogger(__name__)


def request_run(
    task: PeriodicTask, *, requested_by: str = "", force: bool = False, using: str = "default"
) -> Run:
    """Create a manual run of ``task`` due now (database clock); a replica dispatches it once.

    Manual runs do not move the schedule: the task's next scheduled run stays where it is (the
    claim plans and updates ``last_run_at`` for scheduled runs only). A disabled or finished task
    (``run_now_refusal``) is refused with RunNowRefused, whose message says why, unless ``force``.
    """
    now = database_now(using)
    if not force and (why := run_now_refusal(task, now)) is not None:
        raise RunNowRefused(why)
    run = Run.objects.using(using).create(
        periodic_task=task,
        periodic_task_name=task.name,
        task=task.task,
        scheduled_for=now,
        due_at=now,
        trigger=Run.Trigger.MANUAL,
        task_id=str(uuid.uuid4()),
        requested_by=requested_by,
        definition_version=definition_version(task),
    )
    # Debug: the caller reports the result (a command's stdout line, the admin's message).
    logger.debug(
        "manual run of %r requested by %s", task.name, requested_by or "-",
        extra={"action": "run_now"},
    )
    return run


def run_now_refusal(task: PeriodicTask, now: datetime) -> str | None:
    """Return why a manual run of ``task`` needs forcing, or None when it may simply run.

    ``now`` is an aware datetime (the database clock). A task is finished when its ``expires`` is
    at or before ``now``, when its clocked time has passed, or when it is a one-off that has run
    (``last_run_at`` or ``total_run_count`` set, as the claim and stock beat leave them); it is
    disabled when ``enabled`` is off. The text names the task as written: ``'nightly report' is
    finished (its clocked time 2026-01-05 10:00:00 UTC has passed) and disabled``.
    """
    finished = _finished(task, now)
    parts = [f"finished ({finished})"] if finished else []
    if not task.enabled:
        parts.append("disabled")
    return f"{task.name!r} is {' and '.join(parts)}" if parts else None


def _finished(task: PeriodicTask, now: datetime) -> str:
    if task.expires is not None and task.expires <= now:
        return f"it expired at {_utc(task.expires)}"
    if task.clocked_id is not None and task.clocked.clocked_time <= now:
        return f"its clocked time {_utc(task.clocked.clocked_time)} has passed"
    if task.one_off and (task.last_run_at is not None or task.total_run_count):
        return "its one-off run is done"
    return ""


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def slots_before_creation(
    task: PeriodicTask, since: datetime, until: datetime, using: str = "default"
) -> tuple[int, datetime | None]:
    """Count the slots of ``task`` in ``[since, until)`` from before it existed.

    Return ``(count, created)``: ``created`` is when the task was created (its edit history's
    creation entry, an aware datetime), ``count`` its slots in the range before that moment
    that a backfill would run although the task did not exist then: those without a backfill
    run yet (a backfill does not run a slot twice). A task with a
    ``start_time`` exists from it (no slot comes before a start time), so it has none; so has a
    task whose creation the history did not record: ``(0, None)``. Raises ScheduleError for a
    broken schedule.
    """
    if task.start_time is not None:
        return 0, None
    created = _created_at(task, using)
    if created is None or since >= created:
        return 0, created
    end = min(until, created)
    early = sum(1 for _ in slots.slots_between(task, since, end))
    there = Run.objects.using(using).filter(
        periodic_task_id=task.pk, trigger=Run.Trigger.BACKFILL,
        scheduled_for__gte=since, scheduled_for__lt=end,
    ).count()
    return max(early - there, 0), created


def _created_at(task: PeriodicTask, using: str) -> datetime | None:
    """When ``task`` was created (its edit history's creation entry), or None if not recorded."""
    return (
        TaskHistory.objects.using(using)
        .filter(periodic_task_id=task.pk, kind=TaskHistory.Kind.TASK,
                operation=TaskHistory.Operation.CREATED)
        .order_by("version").values_list("changed_at", flat=True).first()
    )


def no_slot_reason(
    task: PeriodicTask, since: datetime, until: datetime, using: str = "default"
) -> str:
    """Say that no slot of ``task`` falls in ``[since, until)`` (aware) and why, when known.

    The reasons: the range ends before the task's ``start_time``, or for a task without one
    before it was created (its edit history); it is shorter than the task's interval (in seconds).
    """
    reasons = []
    created = None if task.start_time is not None else _created_at(task, using)
    if task.start_time is not None and until <= task.start_time:
        reasons.append(f"the range ends before its start time ({_utc(task.start_time)})")
    elif created is not None and until <= created:
        reasons.append(f"the range ends before the task existed (created {_utc(created)})")
    if task.interval is not None:
        every = timedelta(**{task.interval.period: task.interval.every})
        if until - since < every:
            reasons.append(
                f"the range ({(until - since).total_seconds():g} s) is shorter than its "
                f"interval ({every.total_seconds():g} s)"
            )
    why = f": {'; '.join(reasons)}" if reasons else ""
    return f"no slot of the task falls in the range{why}"


@dataclass(frozen=True)
class BackfillProgress:
    """Where a backfill stands: slots seen and runs created so far, the last slot, 0..1 done."""

    slots: int
    created: int
    last_slot: datetime | None
    fraction: float


def backfill(
    task: PeriodicTask,
    since: datetime,
    until: datetime,
    *,
    requested_by: str = "",
    chunk_size: int = 1000,
    progress: Callable[[BackfillProgress], None] | None = None,
    using: str = "default",
) -> BackfillProgress:
    """Create a backfill run of ``task`` for each slot in ``[since, until)``; return the totals.

    ``since`` and ``until`` are aware datetimes; ``until`` must not be after the database clock.
    Slots come from ``slots.next_run`` chaining from ``since``. The runs are due at once and are
    dispatched in slot order by the replicas, subject to the task's overlap policy (under skip,
    a backfill run due while another run of the task is unfinished is recorded skipped).
    Idempotent: a slot that already has a backfill run is left alone (unique constraint
    ``scheduling_run_one_backfill_per_slot``), so asking twice creates nothing new. ``progress``
    is called after each chunk of ``chunk_size`` slots.

    Raises BackfillRejected for an empty or future range, ScheduleError for a broken schedule.
    """
    if since >= until:
        raise BackfillRejected(f"empty range: since {utc_text(since)} is not before until")
    now = database_now(using)
    if until > now:
        raise BackfillRejected(
            f"until {utc_text(until)} is in the future (database clock {utc_text(now)})"
        )
    seen = created = 0
    last: datetime | None = None
    chunk: list[datetime] = []

    def flush() -> None:
        nonlocal created
        created += _insert_backfill(task, chunk, requested_by, using)
        chunk.clear()
        if progress is not None:
            progress(_backfill_progress(seen, created, last, since, until))

    for slot in slots.slots_between(task, since, until):
        seen, last = seen + 1, slot
        chunk.append(slot)
        if len(chunk) >= chunk_size:
            flush()
    if chunk:
        flush()
    logger.debug(  # the caller reports the totals (the command's line, the admin's message)
        "backfill of %r %s..%s by %s: %d slots, %d new runs",
        task.name, since.isoformat(), until.isoformat(), requested_by or "-", seen, created,
        extra={"action": "backfill"},
    )
    return _backfill_progress(seen, created, last, since, until, done=True)


def _backfill_progress(
    seen: int, created: int, last: datetime | None, since: datetime, until: datetime,
    done: bool = False,
) -> BackfillProgress:
    fraction = 1.0 if done or last is None else (last - since) / (until - since)
    return BackfillProgress(seen, created, last, min(1.0, fraction))


def _insert_backfill(
    task: PeriodicTask, chunk: list[datetime], requested_by: str, using: str
) -> int:
    """Insert the backfill runs of ``chunk`` that do not exist yet; return how many are new."""
    if not chunk:
        return 0
    existing = set(
        Run.objects.using(using)
        .live()
        .filter(periodic_task=task, trigger=Run.Trigger.BACKFILL, scheduled_for__in=chunk)
        .values_list("scheduled_for", flat=True)
    )
    missing = [slot for slot in chunk if slot not in existing]
    runs = [
        planned_run(
            task,
            slot,
            trigger=Run.Trigger.BACKFILL,
            task_id=slots.task_id_for(task.pk, slot, Run.Trigger.BACKFILL),
            requested_by=requested_by[:150],
        )
        for slot in missing
    ]
    insert_runs(runs, using)  # a concurrent backfill's rows win; the constraint drops ours
    return len(runs)
