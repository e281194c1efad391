"""Django signals for run outcomes and overdue runs, and the JSON document each one carries.

Connect receivers as to any Django signal; each is sent once per event, with ``sender=Run`` and
one keyword argument, ``event``: a dict ready for ``json.dumps`` (times as ISO 8601 strings, UTC),
the same document the optional webhook posts (``scheduling.webhook``):

- ``run_finished``: a run ended. Sent after the outcome is committed, by the worker process for
  what it records (succeeded, failed, expired, revoked, unknown task, rejected) and by the
  replica for what it ends (a claim's missed, skipped and rejected runs; a reconcile pass's
  "not delivered" and "worker lost"). Cancelled plans and the extra ``missed`` rows of a
  catch-up beyond its first are not announced.
- ``run_overdue``: a replica found a scheduled run not succeeded within its task's success
  deadline (``scheduling.overdue_watch``). Sent by the one replica that marked it, after the mark is
  committed, never inside a claim transaction.

Receivers run in the sending process (a worker or a beat replica) and are called with
``send_robust``: an exception in one is logged and does not reach the worker or the replica.
Every document has ``event`` (``run.finished`` or ``run.overdue``) and ``event_id``, stable for
the event, so a receiver can drop a repeat.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.dispatch import Signal

from scheduling.models import Run

if TYPE_CHECKING:
    from scheduling.ledger.overdue import Overdue

logger = logging.getLogger(__name__)

#: Sent with ``event``: the ``run.finished`` document (``finished_document``).
run_finished = Signal()
#: Sent with ``event``: the ``run.overdue`` document (``overdue_document``).
run_overdue = Signal()


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="milliseconds")


def finished_document(run: Run) -> dict[str, Any]:
    """The ``run.finished`` document of a run whose outcome is recorded.

    Keys: event, event_id (``run.finished:<task id>:<retries>``), run_id, task_id,
    periodic_task_id, periodic_task, task, trigger, scheduled_for, status, reason, error, worker,
    started_at, finished_at, executions.
    """
    return {
        "event": "run.finished",
        "event_id": f"run.finished:{run.task_id}:{run.retries}",
        "run_id": run.pk,
        "task_id": run.task_id,
        "periodic_task_id": run.periodic_task_id,
        "periodic_task": run.periodic_task_name,
        "task": run.task,
        "trigger": run.trigger,
        "scheduled_for": _iso(run.scheduled_for),
        "status": run.status,
        "reason": run.reason,
        "error": run.error,
        "worker": run.worker,
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "executions": run.executions,
    }


def overdue_document(run: Overdue, replica: str) -> dict[str, Any]:
    """The ``run.overdue`` document of a run ``replica`` just marked overdue.

    Keys: event, event_id (``run.overdue:<task id>``), run_id, task_id, periodic_task_id,
    periodic_task, task, scheduled_for, status (when found), deadline_seconds, overdue_at, replica.
    """
    return {
        "event": "run.overdue",
        "event_id": f"run.overdue:{run.task_id}",
        "run_id": run.run_id,
        "task_id": run.task_id,
        "periodic_task_id": run.periodic_task_id,
        "periodic_task": run.periodic_task_name,
        "task": run.task,
        "scheduled_for": _iso(run.scheduled_for),
        "status": run.status,
        "deadline_seconds": run.deadline_seconds,
        "overdue_at": _iso(run.overdue_at),
        "replica": replica,
    }


def send(signal: Signal, event: dict[str, Any]) -> None:
    """Send ``event`` to the receivers of ``signal``; log (never raise) what a receiver raised."""
    for receiver, result in signal.send_robust(sender=Run, event=event):
        if isinstance(result, Exception):
            logger.error(
                "receiver %r of %s failed: %s", receiver, event["event"], result,
                extra={"action": "signal_failed"},
            )


def announce_finished(*task_ids: str) -> None:
    """Send ``run_finished`` for each run of ``task_ids`` just ended; no receiver: no query.

    Called after the outcome's write committed: by the worker's signal handlers (one task id),
    and by a replica for the runs its claim ended (missed, skipped, failed before dispatch) and
    those its reconcile pass closed ("not delivered", "worker lost"). One query for all of them,
    in slot order. Never raises: a failed read is logged.
    """
    if not task_ids or not run_finished.has_listeners(Run):
        return
    try:
        runs = list(
            Run.objects.filter(task_id__in=task_ids)
            .exclude(status=Run.Status.CANCELLED)
            .order_by("scheduled_for", "pk")
        )
    except Exception:  # noqa: BLE001 - an announcement must never fail a worker or a replica
        logger.exception(
            "cannot read runs %s to announce them", task_ids, extra={"action": "signal_failed"}
        )
        return
    for run in runs:
        send(run_finished, finished_document(run))
