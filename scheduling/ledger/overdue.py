"""Overdue runs: scheduled runs that have not succeeded within their task's success deadline.

A dead man's switch read from the ledger: a task with a success deadline (its
``TaskPolicy.success_deadline_seconds``, else ``SCHEDULING_SUCCESS_DEADLINE``) promises that each
scheduled run succeeds within that many seconds of its slot. A run that has not (still pending,
dispatched, running, retrying, or ended failed, missed or expired) is overdue. Every replica runs
``mark_overdue`` on its ticks, outside any claim transaction; one statement marks each such run's
``overdue_at`` once, and only the replica whose statement marked it gets it back, so each overdue
run is reported (signal, webhook, metric) exactly once whatever the number of replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connections

from scheduling.sql import queries

#: How far past the longest deadline in use the pass looks back, seconds: a run whose slot is
#: older than that (every replica down for a day) is not reported any more.
LOOKBACK = 86400.0


@dataclass(frozen=True)
class Overdue:
    """One run a replica just marked overdue (``overdue_at`` and ``scheduled_for``: aware UTC)."""

    run_id: int
    periodic_task_id: int | None
    periodic_task_name: str
    task: str
    task_id: str
    scheduled_for: datetime
    status: str
    overdue_at: datetime
    deadline_seconds: float


def mark_overdue(
    default_deadline: float | None, limit: int = 100, using: str = "default"
) -> list[Overdue]:
    """Mark at most ``limit`` overdue runs and return them, oldest slot first.

    ``default_deadline`` (seconds, or None for none) applies to tasks whose policy sets no
    ``success_deadline_seconds``. One autocommit statement (``queries["mark_overdue"]``): rows
    another session holds are skipped (a claim, a worker recording an outcome; the next pass takes
    them), and a run is returned to exactly one caller across all replicas. Costs one indexed
    query when nothing is overdue, and nothing beyond a tiny read when no deadline is set. Raises
    django.db.DatabaseError when the database cannot be reached.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            queries["mark_overdue"],
            {"deadline": default_deadline, "limit": limit, "lookback": LOOKBACK},
        )
        rows = cursor.fetchall()
    return sorted((Overdue(*row) for row in rows), key=lambda o: (o.scheduled_for, o.run_id))
