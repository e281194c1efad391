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

from scheduling.conf import conf
from scheduling.models import Run, TaskPolicy
from scheduling.sql import queries

logger = logging.getLogger(__name__)


class LostExecutions:
    """One replica's memory of running runs seen without their execution lock.

    Maps (run id, executions) to the database time the lock was first seen free. Kept in memory
    by the scheduler (``LedgerScheduler``) across reconcile passes: a restarted replica starts
    afresh, which only delays a close. ``after`` (seconds) is how long the lock must stay free.
    After a sweep, ``recoverable`` holds the (run id, executions) whose task recovers from a
    lost worker (policy ``recover``), which the redelivery step (``delivery.redeliver``)
    re-publishes, and ``closed`` the (task id, periodic task name) of the runs it closed.
    """

    def __init__(self, after: float) -> None:
        self.after = timedelta(seconds=after)
        self.first_seen: dict[tuple[int, int], datetime] = {}
        self.recoverable: list[tuple[int, int]] = []
        self.closed: list[tuple[str, str]] = []


def close_lost_executions(lost: LostExecutions, using: str = "default") -> list[str]:
    """Act on running runs whose worker is gone, by their worker-loss policy; return closed ids.

    Evidence, not a timeout on the run: while a delivery executes, the worker guard holds the
    run's execution lock (a PostgreSQL advisory lock on (task id, ``retries``), on the executing
    process's own session), and the server frees it when that process dies. A run is lost when
    it is ``running``, was started by the guard (``executions`` > 0, so runs of workers without
    the guard are never touched), and its lock has been free in every pass for at least
    ``lost.after`` (``SCHEDULING_WORKER_LOST_AFTER`` seconds). A redelivery that executes it again
    within that time takes the lock again (and bumps ``executions``), so it is left alone.

    Under worker-loss policy ``fail`` (``TaskPolicy.worker_lost_policy``, else
    ``SCHEDULING_WORKER_LOST_POLICY``), and under ``recover`` once the run was re-published
    ``SCHEDULING_REPUBLISH_LIMIT`` times, the run is closed as failed, "worker lost", by one
    UPDATE that checks the lock again, so a delivery starting meanwhile either wins the row first
    (then nothing is closed) or finds the run failed and is dropped. Under ``recover`` it is left
    in ``lost.recoverable`` for the redelivery step. Returns the closed runs' task ids.

    Two set-based queries per pass, reading ``pg_locks`` once; nothing when no run is running.
    A late outcome of the same attempt still replaces "worker lost" (``record_finished``).
    """
    lost.recoverable, lost.closed = [], []
    with connections[using].cursor() as cursor:
        cursor.execute(queries["running_without_lock"])
        rows = cursor.fetchall()
    if not rows:
        lost.first_seen.clear()
        return []
    now = rows[0][2]
    seen = {(pk, n): lost.first_seen.get((pk, n), now) for pk, n, *_ in rows}
    lost.first_seen = seen
    after = lost.after.total_seconds()
    closing: list[tuple[int, int, str]] = []
    for pk, n, _, task_policy, republished in rows:
        if now - seen[(pk, n)] < lost.after:
            continue
        if (task_policy or conf.worker_lost_policy) == TaskPolicy.WorkerLost.FAIL:
            closing.append((pk, n, _lost_error(after, "worker-loss policy fail: not run again")))
        elif republished >= conf.republish_limit:
            closing.append((pk, n, _lost_error(after, f"re-published {republished} times: no more")))
        else:
            lost.recoverable.append((pk, n))
    if not closing:
        return []
    closed = _close_lost(closing, using)
    for pk, executions, task_id, name in closed:
        lost.first_seen.pop((pk, executions), None)
        logger.error(
            "run %s of %r failed: worker lost (its execution lock was free for %g s)",
            task_id, name, after, extra={"action": "worker_lost"},
        )
    lost.closed = [(task_id, name) for _, _, task_id, name in closed]
    return [task_id for task_id, _ in lost.closed]


def _close_lost(closing: list[tuple[int, int, str]], using: str) -> list[tuple]:
    """Close the runs ``(id, executions, error)`` as failed, worker lost, where their lock is
    still free; return ``(id, executions, task id, task name)`` of those closed."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            queries["close_lost"],
            [
                Run.Reason.WORKER_LOST,
                [pk for pk, _, _ in closing],
                [n for _, n, _ in closing],
                [error for _, _, error in closing],
            ],
        )
        return cursor.fetchall()


def _lost_error(after: float, outcome: str) -> str:
    return (
        f"the worker running it died mid-run (its execution lock was free for {after:g} s or "
        f"more, or its database session ended); {outcome}"
    )
