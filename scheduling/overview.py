"""Read-only views of the ledger for people: one row per periodic task, its schedule in words.

No transactions or locks here (``ledger`` owns those): plain reads, one query for all tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cron_descriptor import (
    ExpressionDescriptor,
    FormatException,
    MissingFieldException,
    Options,
    WrongArgumentException,
)
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Coalesce
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from scheduling.clock import database_now
from scheduling.durations import seconds
from scheduling.exceptions import ScheduleError
from scheduling.models import Pause, Run, TaskPolicy
from scheduling.timeformat import utc_text
from scheduling.upcoming import UpcomingRun, upcoming_runs


@dataclass(frozen=True)
class Paused:
    """A task's open pause: since when (aware, UTC, the database clock), by whom, and why."""

    since: datetime
    by: str
    why: str

    def describe(self) -> str:
        """``paused since 2026-01-05 10:00:00 UTC by alice: quarter close`` (why "-" if empty)."""
        return f"paused since {utc_text(self.since, 's')} by {self.by}: {self.why or '-'}"

    def as_json(self) -> dict[str, str]:
        """``{"since": ISO UTC, "by": ..., "why": ...}``."""
        return {"since": self.since.isoformat(), "by": self.by, "why": self.why}


@dataclass(frozen=True)
class TaskStatus:
    """One periodic task as ``scheduling_status`` shows it.

    ``next_run``: the earliest pending run's slot (None while paused: it will not be dispatched); ``last_status`` and ``last_run``: the newest
    run by slot that is neither pending nor cancelled (its status and slot); ``lateness``:
    dispatched_at - due_at of the newest dispatched scheduled run, seconds. Datetimes are
    aware, UTC; each is None when there is no such run. ``upcoming``: the next slots after the
    database clock (``scheduling.upcoming``), as many as asked for; ``upcoming_error``: why the
    schedule gives none (a ScheduleError's text), else "". ``paused``: the task's open pause,
    None when it is not paused; a paused task has no upcoming slot (resuming plans the first slot
    after the resume). ``buffered``: its runs waiting for an unfinished run of the task (overlap
    policies buffer_one: 0 or 1; buffer_all: up to its ``buffer_limit``; replace: 0 or 1).
    ``overlap``: its overlap policy in words with its parameter (``describe_overlap``).
    """

    name: str
    schedule: str
    enabled: bool
    next_run: datetime | None
    last_status: str | None
    last_run: datetime | None
    lateness: float | None
    upcoming: tuple[UpcomingRun, ...] = ()
    upcoming_error: str = ""
    paused: Paused | None = None
    buffered: int = 0
    overlap: str = "allow"


def with_status(tasks: QuerySet[PeriodicTask]) -> QuerySet[PeriodicTask]:
    """``tasks`` with their schedule rows joined and what a status row shows annotated.

    ``next_run`` (the earliest pending run's slot), ``last_status`` and ``last_run`` (the newest
    run by slot that is neither pending nor cancelled), ``lateness`` (a timedelta: dispatched_at
    - due_at of the newest dispatched scheduled run) and ``paused_at``, ``paused_by``,
    ``paused_why`` (the open pause; NULL when not paused) and ``buffered`` (its buffered runs):
    subqueries, so a page of tasks is one query whatever its length.
    """
    pause = Pause.objects.open().filter(periodic_task=OuterRef("pk")).order_by()
    runs = Run.objects.filter(periodic_task=OuterRef("pk"))
    pending = runs.pending().order_by("scheduled_for", "pk")
    last = runs.exclude(status__in=(Run.Status.PENDING, Run.Status.CANCELLED)).order_by(
        "-scheduled_for", "-pk"
    )
    buffered = (
        runs.filter(status=Run.Status.BUFFERED).order_by().values("periodic_task")
        .annotate(n=Count("pk"))
    )
    dispatched = (
        runs.scheduled()
        .filter(dispatched_at__isnull=False)
        .order_by("-scheduled_for", "-pk")
        .annotate(
            late=ExpressionWrapper(
                F("dispatched_at") - F("due_at"), output_field=DurationField()
            )
        )
    )
    return tasks.select_related("interval", "crontab", "clocked", "solar").annotate(
        next_run=Subquery(pending.values("scheduled_for")[:1]),
        last_status=Subquery(last.values("status")[:1]),
        last_run=Subquery(last.values("scheduled_for")[:1]),
        lateness=Subquery(dispatched.values("late")[:1]),
        paused_at=Subquery(pause.values("paused_at")[:1]),
        paused_by=Subquery(pause.values("paused_by")[:1]),
        paused_why=Subquery(pause.values("why")[:1]),
        buffered=Coalesce(Subquery(buffered.values("n")[:1]), 0),
    )


def paused_of(task: PeriodicTask) -> Paused | None:
    """The open pause of a task annotated by ``with_status``, or None."""
    if task.paused_at is None:
        return None
    return Paused(task.paused_at, task.paused_by, task.paused_why)


def task_statuses(upcoming: int = 0) -> list[TaskStatus]:
    """Return every periodic task's status, by name, with its next ``upcoming`` slots (>= 0).

    One query for every task (``with_status``).
    """
    tasks = (
        with_status(PeriodicTask.objects.all()).select_related("scheduling_policy").order_by("name")
    )
    now = database_now()
    statuses = []
    for task in tasks:
        paused = paused_of(task)
        statuses.append(TaskStatus(
            name=task.name,
            schedule=describe_schedule(task),
            enabled=task.enabled,
            next_run=None if paused else task.next_run,
            last_status=task.last_status,
            last_run=task.last_run,
            lateness=seconds(task.lateness),
            paused=paused,
            buffered=task.buffered,
            overlap=describe_overlap(getattr(task, "scheduling_policy", None)),
            **_upcoming(task, now, 0 if paused else upcoming),
        ))
    return statuses


def _upcoming(task: PeriodicTask, now: datetime, count: int) -> dict[str, Any]:
    if not count:
        return {}
    try:
        return {"upcoming": tuple(upcoming_runs(task, now, count))}
    except (ScheduleError, LookupError) as exc:  # LookupError: a crontab zone zoneinfo lacks
        return {"upcoming_error": str(exc)}


def describe_overlap(policy: TaskPolicy | None) -> str:
    """Return a task's overlap policy in words with its parameter: "allow", "skip", "buffer
    one", "buffer all (limit 100)" (its ``buffer_limit``, runs), "replace (finish)" or "replace
    (terminate)" (its ``replace_started``: ``TaskPolicy.OVERLAP_DETAIL``). ``policy`` None (no scheduling policy row): "allow".
    A value this release does not know is shown as stored."""
    if policy is None:
        return "allow"
    kind = policy.overlap_policy
    words = str(kind).replace("_", " ")
    detail = TaskPolicy.OVERLAP_DETAIL.get(kind)
    return words if detail is None else f"{words} ({detail.format_map(vars(policy))})"


def describe_schedule(task: PeriodicTask) -> str:
    """Return the task's schedule in words: "every 5 seconds", "At 09:00 (Europe/Berlin)".

    Crontabs are described by cron-descriptor with their time zone (``describe_crontab``); a
    clocked schedule is "once at <UTC time>"; a solar one "<event> at <latitude>, <longitude>".
    A one-off interval or crontab task gets ", once".
    """
    if task.interval is not None:
        words = str(task.interval)
    elif task.crontab is not None:
        words = describe_crontab(task.crontab)
    elif task.clocked is not None:
        return f"once at {utc_text(task.clocked.clocked_time, 's')}"
    elif task.solar is not None:
        solar = task.solar
        return (
            f"{solar.get_event_display()} at {float(solar.latitude):g}, "
            f"{float(solar.longitude):g}"
        )
    else:
        return "no schedule"
    return f"{words}, once" if task.one_off else words


def describe_crontab(crontab: CrontabSchedule) -> str:
    """Return "At 09:00, only on Monday (Europe/Berlin)": cron-descriptor, 24-hour clock.

    An expression cron-descriptor cannot read is shown as it is, with its time zone.
    """
    fields = (
        crontab.minute, crontab.hour, crontab.day_of_month, crontab.month_of_year,
        crontab.day_of_week,
    )
    expression = " ".join(str(field) for field in fields)
    options = Options()
    options.use_24hour_time_format = True
    try:
        words = ExpressionDescriptor(expression, options).get_description()
    except (FormatException, MissingFieldException, WrongArgumentException):
        words = expression
    return f"{words} ({crontab.timezone})"



