"""Lost executions: running runs whose worker died, found by their free execution lock.

While a delivery executes, the worker guard holds the run's execution lock (a PostgreSQL advisory
lock on ``scheduling_execution_lock_key(task id, retries)``, on the executing process's own
session); the server frees it when that process dies. That is the evidence this sweep acts on,
not a timeout on the run.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import connections

from scheduling.models import Run
from scheduling.sql import queries

logger = logging.getLogger(__name__)


class LostExecutions:
    """One replica's memory of running runs seen without their execution lock.

    Maps (run id, executions) to the database time the lock was first seen free. Kept in memory
    by the scheduler (``LedgerScheduler``) across reconcile passes: a restarted replica starts
    afresh, which only delays a close. ``after`` (seconds) is how long the lock must stay free.
    """

    def __init__(self, after: float) -> None:
        self.after = timedelta(seconds=after)
        self.first_seen: dict[tuple[int, int], datetime] = {}


def close_lost_executions(lost: LostExecutions, using: str = "default") -> list[str]:
    """Close running runs whose worker is gone as failed, reason "worker lost"; return task ids.

    Evidence, not a timeout on the run: while a delivery executes, the worker guard holds the
    run's execution lock (a PostgreSQL advisory lock on (task id, ``retries``), on the executing
    process's own session), and the server frees it when that process dies. A run is closed when
    it is ``running``, was started by the guard (``executions`` > 0, so runs of workers without
    the guard are never touched), and its lock has been free in every pass for at least
    ``lost.after`` (``SCHEDULING_WORKER_LOST_AFTER`` seconds). A redelivery that executes it again
    within that time takes the lock again (and bumps ``executions``), so it is left alone. The
    close is one UPDATE that checks the lock again, so a delivery starting meanwhile either wins
    the row first (then nothing is closed) or finds the run failed and is suppressed.

    Two set-based queries per pass, reading ``pg_locks`` once; nothing when no run is running.
    A late outcome of the same attempt still replaces "worker lost" (``record_finished``).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(queries["running_without_lock"])
        rows = cursor.fetchall()
    if not rows:
        lost.first_seen.clear()
        return []
    now = rows[0][2]
    seen = {(pk, n): lost.first_seen.get((pk, n), now) for pk, n, _ in rows}
    lost.first_seen = seen
    due = [key for key, since in seen.items() if now - since >= lost.after]
    if not due:
        return []
    error = (
        f"the execution lock was free for {lost.after.total_seconds():g} s or more: the worker "
        "running this attempt died (or lost its database session), and no redelivery started "
        "it again"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(
            queries["close_lost"],
            [Run.Reason.WORKER_LOST, error, [pk for pk, _ in due], [n for _, n in due]],
        )
        closed = cursor.fetchall()
    for pk, executions, task_id, name in closed:
        lost.first_seen.pop((pk, executions), None)
        logger.error(
            "run %s of %r failed: worker lost (its execution lock was free for %g s)",
            task_id, name, lost.after.total_seconds(), extra={"action": "worker_lost"},
        )
    return [task_id for _, _, task_id, _ in closed]
