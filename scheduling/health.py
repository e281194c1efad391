"""The health probe's verdict: a replica ticked recently and no run is overdue.

Read-only, a few queries, all on the database clock (``clock_timestamp()``). Used by
``manage.py scheduling_health`` (a container healthcheck); the replica rows are heartbeats
(``scheduling.replicas``), which are for display and probes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Min, Q

from scheduling import cadences
from scheduling.clock import ClockTimestamp
from scheduling.conf import conf
from scheduling.models import Replica, Run
from scheduling.replicas import with_state
from scheduling.sql import queries
from scheduling.timeformat import utc_text

#: How far back the probe's line counts runs closed without executing.
CLOSED_WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class OverdueTask:
    """A periodic task overdue now: ``runs`` overdue since its last success, the oldest slot
    ``since`` (aware UTC)."""

    name: str
    runs: int
    since: datetime


@dataclass(frozen=True)
class LedgerSize:
    """The run ledger: ``runs`` rows, ``bytes`` on disk (its table's indexes and TOAST
    included), the ``oldest`` run's slot (aware UTC; None when empty)."""

    runs: int
    bytes: int
    oldest: datetime | None


@dataclass(frozen=True)
class Verdict:
    """``healthy`` and the one line that says why (``ok: ...`` or ``unhealthy: ...``)."""

    healthy: bool
    line: str


def check(max_tick_age: float, max_overdue: float, host: str | None = None) -> Verdict:
    """Judge the deployment (or the replicas on ``host`` only); ages and thresholds in seconds.

    Unhealthy when no replica that is not stopped ticked within ``max_tick_age`` seconds, when
    a run is still pending more than ``max_overdue`` seconds after its ``due_at`` (its slot, or
    later by the task's jitter; nobody claimed it, or every claim of it rolled back or hangs),
    or when a dispatched run no worker started is past its delivery deadline plus a reconcile
    interval (nothing re-published it), or when a periodic task is overdue (``overdue_tasks``:
    its runs stopped succeeding within its success deadline), naming the tasks. A healthy line
    also counts the runs closed "not delivered" or "worker lost" in the last 24 h. Every reason
    found goes on the one line, separated by ``; ``. Raises django.db.DatabaseError when the
    database cannot be read.
    """
    replicas = Replica.objects.all() if host is None else Replica.objects.filter(host=host)
    seen = with_state(replicas).aggregate(
        total=Count("pk"),
        running=Count("pk", filter=Q(stopped_at__isnull=True)),
        recent=Count("pk", filter=Q(stopped_at__isnull=True, tick_age__lte=max_tick_age)),
        newest_age=Min("tick_age", filter=Q(stopped_at__isnull=True)),
    )
    where = "" if host is None else f" on host {host!r}"
    found = (_replicas_reason(seen, where, max_tick_age), _pending_reason(max_overdue))
    reasons = [reason for reason in found if reason]
    overdue_now = overdue_tasks(CLOSED_WINDOW.total_seconds())
    if overdue_now:
        names = ", ".join(repr(task.name) for task in overdue_now)
        tasks = "1 task" if len(overdue_now) == 1 else f"{len(overdue_now)} tasks"
        reasons.append(f"{tasks} overdue (no run succeeded within its deadline): {names}")
    undelivered = _undelivered()
    if undelivered:
        runs = "1 run" if undelivered == 1 else f"{undelivered} runs"
        reasons.append(
            f"{runs} dispatched and not started past the delivery deadline and a reconcile pass "
            "(nothing re-published them)"
        )
    if reasons:
        return Verdict(False, "unhealthy: " + "; ".join(reasons))
    live = "1 replica" if seen["recent"] == 1 else f"{seen['recent']} replicas"
    return Verdict(
        True,
        f"ok: {live}{where} ticked within {max_tick_age:g} s; "
        f"no run pending more than {max_overdue:g} s past the slot{_closed_lately()}",
    )


def _replicas_reason(seen: dict, where: str, max_tick_age: float) -> str:
    """Why the replicas counted in ``seen`` are unhealthy, or "" (ages in seconds)."""
    if not seen["total"]:
        return f"no beat replica{where} has ever ticked"
    if not seen["running"]:
        return f"every beat replica{where} is stopped ({seen['total']} stopped)"
    if not seen["recent"]:
        return (
            f"no beat replica{where} ticked within {max_tick_age:g} s "
            f"(newest tick {seen['newest_age']:.0f} s ago)"
        )
    return ""


def _pending_reason(max_overdue: float) -> str:
    """The runs still pending more than ``max_overdue`` seconds after their due moment, or ""."""
    overdue = Run.objects.pending().filter(
        due_at__lt=ClockTimestamp() - timedelta(seconds=max_overdue)
    )
    late = overdue.aggregate(count=Count("pk"))
    if not late["count"]:
        return ""
    oldest = overdue.order_by("due_at", "pk").values_list("periodic_task_name", "scheduled_for")[0]
    runs = "1 run" if late["count"] == 1 else f"{late['count']} runs"
    return (
        f"{runs} pending more than {max_overdue:g} s past the slot (oldest: {oldest[0]!r} "
        f"scheduled for {utc_text(oldest[1])})"
    )


def overdue_tasks(window: float) -> list[OverdueTask]:
    """Periodic tasks overdue now, by name: a run marked within ``window`` seconds, no success since.

    A replica marks a run overdue (``ledger.mark_overdue``) when it has not succeeded within its
    task's success deadline; the task stays overdue until one of its runs at or after that slot
    succeeds (the overdue run's own late success included). Runs of deleted tasks do not count.
    Read-only, one query on the partial index ``scheduling_run_overdue``. Raises
    django.db.DatabaseError when the database cannot be read.
    """
    with connection.cursor() as cursor:
        cursor.execute(queries["overdue_tasks"], {"window": window})
        return [OverdueTask(*row) for row in cursor.fetchall()]


def ledger_size() -> LedgerSize:
    """How large the run ledger is: it keeps every run unless ``SCHEDULING_PRUNE_OLDER_THAN``
    is set (docs/operating.md, "Pruning the ledger").

    One query that reads the whole table (``count(*)``): for a page, not for a frequent probe.
    Raises django.db.DatabaseError when the database cannot be read.
    """
    with connection.cursor() as cursor:
        cursor.execute(queries["ledger_size"])
        return LedgerSize(*cursor.fetchone())


def _undelivered() -> int:
    """Dispatched runs no worker started past their delivery deadline plus a reconcile interval.

    The reconcile pass re-publishes a run at its deadline (``ledger.redeliver``); one still
    waiting a pass later means no replica is doing it.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            queries["undelivered_count"],
            {"timeout": conf.delivery_timeout, "grace": cadences.RECONCILE_INTERVAL},
        )
        return int(cursor.fetchone()[0])


def _closed_lately() -> str:
    """``; N runs closed "not delivered" and M "worker lost" in the last 24 h``, or ""."""
    counts = Run.objects.filter(
        status=Run.Status.FAILED,
        reason__in=(Run.Reason.NOT_DELIVERED, Run.Reason.WORKER_LOST),
        finished_at__gte=ClockTimestamp() - CLOSED_WINDOW,
    ).aggregate(
        not_delivered=Count("pk", filter=Q(reason=Run.Reason.NOT_DELIVERED)),
        worker_lost=Count("pk", filter=Q(reason=Run.Reason.WORKER_LOST)),
    )
    parts = [
        f'{n} {"run" if n == 1 else "runs"} closed "{reason}"'
        for reason, n in (
            (Run.Reason.NOT_DELIVERED, counts["not_delivered"]),
            (Run.Reason.WORKER_LOST, counts["worker_lost"]),
        )
        if n
    ]
    return f"; {' and '.join(parts)} in the last 24 h" if parts else ""
