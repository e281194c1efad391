"""Build what a replica sends for a run from its periodic task row: the beat entry's parts.

Kept apart from ``ledger`` (transactions) and ``publisher`` (Celery beat's hooks) so that bad
input is turned into a RunRejected with a clear reason in exactly one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from scheduling.exceptions import RunRejected

#: Message headers every run carries; the worker side finds its run by them.
HEADER_RUN = "scheduling_run"
HEADER_TASK_NAME = "periodic_task_name"
HEADER_SCHEDULED_FOR = "scheduled_for"


#: Celery schedules kept per process, one per distinct schedule row (a few hundred bytes each).
SCHEDULES_KEPT = 4096


@dataclass
class Message:
    """What to publish for one run: the parts of the Celery beat entry of its periodic task.

    ``name`` is the periodic task's name, ``task`` the Celery task's; ``schedule`` the Celery
    schedule django-celery-beat gives the task (``PeriodicTask.schedule``; None without one);
    ``options`` what beat passes to ``apply_async``: the run's ``task_id`` and ``headers``, the
    task's queue, exchange, routing key, priority and expiry. ``last_run_at`` and
    ``total_run_count`` are the task row's. ``publisher.RunPublisher`` makes a
    ``celery.beat.ScheduleEntry`` of them.
    """

    name: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    schedule: Any = None
    last_run_at: datetime | None = None
    total_run_count: int = 0


def build_message(run: Any, task: PeriodicTask, now: datetime | None = None) -> Message:
    """Return the message for ``run`` of ``task`` (a ``scheduling.models.Run``).

    The options carry the run's deterministic ``task_id`` and the headers ``periodic_task_name``,
    ``scheduled_for`` (ISO 8601, UTC) and ``scheduling_run`` (the run's id), plus the task's queue,
    exchange, routing key, priority and message expiry as django-celery-beat sends them.

    ``now`` is the database clock at the publish (aware): the task's ``expire_seconds`` then
    becomes the instant ``now + expire_seconds``. Celery would count the seconds from the
    publishing process's own clock, so a replica an hour behind would send messages that expired
    an hour ago. Without ``now`` the seconds are passed on as they are.

    Raises RunRejected when args, kwargs or headers are not valid JSON of the right shape, or
    the task's schedule row is one Celery cannot load.
    """
    args = load_json(task.args, "args")
    kwargs = load_json(task.kwargs, "kwargs")
    headers = load_json(task.headers, "headers")
    headers.update(
        {
            HEADER_RUN: run.pk,
            HEADER_TASK_NAME: task.name,
            HEADER_SCHEDULED_FOR: run.scheduled_for.astimezone(UTC).isoformat(),
        }
    )
    options: dict[str, Any] = {"task_id": run.task_id, "headers": headers}
    for option in ("queue", "exchange", "routing_key", "priority"):
        value = getattr(task, option)
        if value is not None and value != "":
            options[option] = value
    if task.expire_seconds is not None:
        options["expires"] = (
            task.expire_seconds if now is None else now + timedelta(seconds=task.expire_seconds)
        )
    elif task.expires is not None:
        options["expires"] = task.expires
    return Message(
        name=task.name, task=task.task, args=args, kwargs=kwargs, options=options,
        schedule=beat_schedule(task), last_run_at=task.last_run_at,
        total_run_count=task.total_run_count,
    )


def beat_schedule(task: Any) -> Any:
    """Return the Celery schedule of ``task`` as django-celery-beat's ``PeriodicTask.schedule``
    gives it (``celery.schedules.schedule``, its ``TzAwareCrontab``, ``solar``, ``clocked``), or
    None for a task without a schedule.

    ``task`` is a ``PeriodicTask`` or a ``ledger.claim_rows.ClaimedTask``: the schedule's columns
    are read by the model's field names. Each distinct row is built once per process. Raises
    RunRejected for a row Celery cannot load (a crontab field out of range, a solar schedule
    without the ``ephem`` package).
    """
    try:
        if task.interval is not None:
            return _interval(task.interval.every, task.interval.period)
        if task.crontab is not None:
            c = task.crontab
            return _crontab(
                c.minute, c.hour, c.day_of_month, c.month_of_year, c.day_of_week, str(c.timezone)
            )
        if task.solar is not None:
            s = task.solar
            return _solar(s.event, s.latitude, s.longitude)
        if task.clocked is not None:
            return _clocked(task.clocked.clocked_time)
    except (ValueError, ImportError) as exc:
        raise RunRejected(f"its schedule cannot be loaded: {exc}") from exc
    return None


@lru_cache(maxsize=SCHEDULES_KEPT)
def _interval(every: int, period: str) -> Any:
    return IntervalSchedule(every=every, period=period).schedule


@lru_cache(maxsize=SCHEDULES_KEPT)
def _crontab(
    minute: str, hour: str, day_of_month: str, month_of_year: str, day_of_week: str, zone: str
) -> Any:
    return CrontabSchedule(
        minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year,
        day_of_week=day_of_week, timezone=zone,
    ).schedule


@lru_cache(maxsize=SCHEDULES_KEPT)
def _solar(event: str, latitude: Any, longitude: Any) -> Any:
    return SolarSchedule(event=event, latitude=latitude, longitude=longitude).schedule


@lru_cache(maxsize=SCHEDULES_KEPT)
def _clocked(clocked_time: datetime) -> Any:
    return ClockedSchedule(clocked_time=clocked_time).schedule


#: The JSON shape of each periodic task field a message is built from, and its empty value.
_SHAPES: dict[str, tuple[type, str]] = {
    "args": (list, "[]"), "kwargs": (dict, "{}"), "headers": (dict, "{}")
}


def load_json(raw: str | None, label: str) -> Any:
    """Parse a periodic task's ``args`` (a JSON list), ``kwargs`` or ``headers`` (JSON objects).

    ``label`` is the field's name; an empty value is the empty list or object. Raises RunRejected
    with the reason shown on the run (and in the admin form, which applies the same rule).
    """
    kind, empty = _SHAPES[label]
    try:
        value = json.loads(raw or empty)
    except (TypeError, ValueError) as exc:
        raise RunRejected(f"invalid {label} JSON: {exc}") from exc
    if not isinstance(value, kind):
        raise RunRejected(f"{label} must be a JSON {kind.__name__}, got {type(value).__name__}")
    return value

