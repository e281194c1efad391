"""The replicas' overdue watch: missed-run alerts, a dead man's switch read from the ledger.

A task with a success deadline (``TaskPolicy.success_deadline_seconds``, else
``SCHEDULING_SUCCESS_DEADLINE``) promises each scheduled run succeeds within that many seconds
of its slot. Every ``cadences.OVERDUE_INTERVAL`` seconds each replica, after its tick and
outside any claim transaction, marks the runs that broke the promise (``ledger.mark_overdue``:
one bounded UPDATE; each run is returned to one replica only) and reports each once: a warning
log line, ``signals.run_overdue`` (so the webhook), and the ``scheduling_runs_overdue_total``
counter. It also refreshes the ``scheduling_task_overdue_runs`` gauge from the ledger
(``health.overdue_tasks``), the same state ``manage.py scheduling_health`` reports.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError

from scheduling import cadences, ledger, metrics, signals
from scheduling.conf import conf
from scheduling.health import CLOSED_WINDOW, overdue_tasks

logger = logging.getLogger(__name__)


class OverdueWatch:
    """One replica's overdue passes: ``step()`` after each tick, a pass per interval.

    The gauge is refreshed at the first pass, after a pass that marked runs, and at least every
    ``cadences.HEARTBEAT_INTERVAL`` seconds. Errors are logged and the pass skipped; a database
    outage is the tick's to report, so it is logged at debug here.
    """

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self._next_pass = 0.0
        self._next_gauge = 0.0

    def step(self) -> list[ledger.Overdue]:
        """Make one overdue pass when due; return the runs this replica marked (empty if none)."""
        now = time.monotonic()
        if now < self._next_pass:
            return []
        self._next_pass = now + cadences.OVERDUE_INTERVAL
        try:
            found = ledger.mark_overdue(conf.success_deadline, cadences.BATCH_SIZE)
            if found or now >= self._next_gauge:
                self._next_gauge = now + cadences.HEARTBEAT_INTERVAL
                metrics.observe_overdue_tasks(overdue_tasks(CLOSED_WINDOW.total_seconds()))
        except DatabaseError as exc:
            logger.debug("overdue pass skipped: %s", exc, extra={"action": "overdue_failed"})
            return []
        except Exception:  # noqa: BLE001 - alerts must never stop a replica
            logger.exception("overdue pass failed", extra={"action": "overdue_failed"})
            return []
        for run in found:
            logger.warning(
                "run of %r scheduled for %s is overdue: not succeeded %g s after its slot (%s)",
                run.periodic_task_name, run.scheduled_for.isoformat(timespec="milliseconds"),
                run.deadline_seconds, run.status,
                extra={"action": "overdue", "replica": self.replica_id, "task_id": run.task_id},
            )
            signals.send(signals.run_overdue, signals.overdue_document(run, self.replica_id))
        metrics.observe_overdue(found, self.replica_id)
        return found
