"""Unsaved periodic tasks and slot helpers for the unit tests of ``scheduling.slots``.

No database: ``slots`` looks at ``task.interval_id`` and friends, so each related schedule gets a
fake primary key before it is assigned, which sets the ``*_id`` attribute.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
)

from scheduling import slots

NY = "America/New_York"
BERLIN = "Europe/Berlin"
SYDNEY = "Australia/Sydney"
KOLKATA = "Asia/Kolkata"

GRACE = timedelta(seconds=60)
_ids = itertools.count(1)


def next_id() -> int:
    """Return a fresh fake primary key for an unsaved schedule."""
    return next(_ids)


def utc(*args: int) -> datetime:
    """Return an aware UTC datetime: utc(2025, 3, 9, 20, 4)."""
    return datetime(*args, tzinfo=UTC)


def interval_task(every: int, period: str = IntervalSchedule.SECONDS, **fields) -> PeriodicTask:
    """Return an unsaved interval task (the schedule gets a fake id so ``interval_id`` is set)."""
    n = next_id()
    schedule = IntervalSchedule(id=n, every=every, period=period)
    return PeriodicTask(
        name=f"interval-{n}", task="project.tasks.record", interval=schedule, **fields
    )


def cron_task(expr: str, tz: str = "UTC", **fields) -> PeriodicTask:
    """Return an unsaved crontab task for a five-field expression evaluated in zone ``tz``."""
    n = next_id()
    minute, hour, day_of_month, month_of_year, day_of_week = expr.split()
    schedule = CrontabSchedule(
        id=n,
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
        timezone=tz,
    )
    return PeriodicTask(name=f"cron-{n}", task="project.tasks.record", crontab=schedule, **fields)


def clocked_task(clocked: ClockedSchedule, **fields) -> PeriodicTask:
    """Return an unsaved one-off task on ``clocked`` (django-celery-beat requires one_off)."""
    fields.setdefault("one_off", True)
    n = next_id()
    return PeriodicTask(name=f"clocked-{n}", task="project.tasks.record", clocked=clocked, **fields)


def chain(task: PeriodicTask, after: datetime, before: datetime) -> list[datetime]:
    """Return every slot of ``task`` in ``(after, before)`` by chaining ``next_run``."""
    found: list[datetime] = []
    slot = slots.next_run(task, after)
    while slot is not None and slot < before:
        found.append(slot)
        slot = slots.next_run(task, slot)
    return found


def take(task: PeriodicTask, after: datetime, n: int) -> list[datetime]:
    """Return the first ``n`` slots of ``task`` after ``after`` (fewer if the schedule ends)."""
    found: list[datetime] = []
    slot = slots.next_run(task, after)
    while slot is not None and len(found) < n:
        found.append(slot)
        slot = slots.next_run(task, slot)
    return found
