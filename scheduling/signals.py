"""Django signals for run outcomes and overdue runs, and the JSON document each one carries.

Connect receivers as to any Django signal; each is sent once per event, with ``sender=Run`` and
one keyword argument, ``event``: a dict ready for ``json.dumps`` (times as ISO 8601 strings, UTC),
the same document the optional webhook posts (``scheduling.webhook``):

- ``run_finished``: a worker recorded a run's outcome (``status`` succeeded or failed, or expired,
  revoked, unknown task). Sent by the worker process, after the outcome is committed.
- ``run_overdue``: a replica found a scheduled run not succeeded within its task's success
  deadline (``scheduling.overdue``). Sent by the one replica that marked it, after the mark is
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


def announce_finished(task_id: str) -> None:
    """Send ``run_finished`` for the run of ``task_id`` just recorded; no receiver: no query.

    Called by the worker's signal handlers after the outcome's write committed. Never raises: a
    failed read is logged.
    """
    if not run_finished.has_listeners(Run):
        return
    try:
        run = Run.objects.filter(task_id=task_id).exclude(status=Run.Status.CANCELLED).first()
    except Exception:  # noqa: BLE001 - an announcement must never fail the worker
        logger.exception("cannot read run %s to announce it", task_id, extra={"action": "signal_failed"})
        return
    if run is not None:
        send(run_finished, finished_document(run))
