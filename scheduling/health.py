"""The health probe's verdict: a replica ticked recently and no run is overdue.

Read-only, a few queries, all on the database clock (``clock_timestamp()``). Used by
``manage.py scheduling_health`` (a container healthcheck); the replica rows are heartbeats
(``scheduling.replicas``), which are for display and probes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, Min, Q

from scheduling.clock import ClockTimestamp
from scheduling.models import Replica, Run
from scheduling.replicas import with_state


@dataclass(frozen=True)
class Verdict:
    """``healthy`` and the one line that says why (``ok: ...`` or ``unhealthy: ...``)."""

    healthy: bool
    line: str


def check(max_tick_age: float, max_overdue: float, host: str | None = None) -> Verdict:
    """Judge the deployment (or the replicas on ``host`` only); ages and thresholds in seconds.

    Unhealthy when no replica that is not stopped ticked within ``max_tick_age`` seconds, or when
    a run is still pending more than ``max_overdue`` seconds after its ``scheduled_for`` (nobody
    claimed it, or every claim of it rolled back or hangs). Every reason found goes on the one
    line, separated by ``; ``. Raises django.db.DatabaseError when the database cannot be read.
    """
    replicas = Replica.objects.all() if host is None else Replica.objects.filter(host=host)
    seen = with_state(replicas).aggregate(
        total=Count("pk"),
        running=Count("pk", filter=Q(stopped_at__isnull=True)),
        recent=Count("pk", filter=Q(stopped_at__isnull=True, tick_age__lte=max_tick_age)),
        newest_age=Min("tick_age", filter=Q(stopped_at__isnull=True)),
    )
    overdue = Run.objects.pending().filter(
        scheduled_for__lt=ClockTimestamp() - timedelta(seconds=max_overdue)
    )
    late = overdue.aggregate(count=Count("pk"))
    where = "" if host is None else f" on host {host!r}"
    reasons = []
    if not seen["total"]:
        reasons.append(f"no beat replica{where} has ever ticked")
    elif not seen["running"]:
        reasons.append(f"every beat replica{where} is stopped ({seen['total']} stopped)")
    elif not seen["recent"]:
        reasons.append(
            f"no beat replica{where} ticked within {max_tick_age:g} s "
            f"(newest tick {seen['newest_age']:.0f} s ago)"
        )
    if late["count"]:
        oldest = overdue.order_by("scheduled_for", "pk").values_list(
            "periodic_task_name", "scheduled_for"
        )[0]
        runs = "1 run" if late["count"] == 1 else f"{late['count']} runs"
        reasons.append(
            f"{runs} pending more than {max_overdue:g} s past the slot (oldest: {oldest[0]!r} "
            f"scheduled for {oldest[1].isoformat(timespec='milliseconds')})"
        )
    if reasons:
        return Verdict(False, "unhealthy: " + "; ".join(reasons))
    live = "1 replica" if seen["recent"] == 1 else f"{seen['recent']} replicas"
    return Verdict(
        True,
        f"ok: {live}{where} ticked within {max_tick_age:g} s; "
        f"no run pending more than {max_overdue:g} s past the slot",
    )
