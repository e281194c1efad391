"""The periodic tasks' bookkeeping columns, written in batches: ``TaskBook``.

django-celery-beat shows ``last_run_at`` and ``total_run_count`` on each task; stock beat keeps
them in memory and writes them back every few minutes (its ``sync``). A claim wrote them in its
own transaction, one row version per task per claim: with a task due every second, every row of
``django_celery_beat_periodictask`` gained a version a second, and the claim, which reads those
rows, walked their chains whenever a long transaction elsewhere kept vacuum from removing them
(the benchmark's MVCC horizon: 2,000 runs/s catching up, the claim 3.3x slower after two minutes,
2.5x fewer runs dispatched per second). A replica's ``TaskBook`` gathers what its claims
committed and writes it every ``EVERY`` seconds and at a clean stop, in one short transaction.

What it gives up: a replica killed (SIGKILL, a lost host) loses the counts of its last
``EVERY`` seconds, as stock beat loses the ones since its last sync. The ledger's runs are the
audit, complete either way. A claim that ends a task's schedule (a one-off run, an expired
task) still writes that task's row itself: ``enabled`` must turn off with the commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import transaction

from scheduling.ledger.writes import TaskUpdate, update_tasks

logger = logging.getLogger(__name__)

#: Seconds between two writes of a replica's bookkeeping. Each write is a version of every task
#: row the replica dispatched for, which the claim's join reads until vacuum may remove it: with
#: 5 s, two replicas and a 10-minute transaction open elsewhere, 240 versions a row, and the
#: claim read 20,361 buffers where it read 1,830 (bench mvcc_horizon). Stock beat writes them
#: every 3 minutes (``DatabaseScheduler.sync_every``).
EVERY = 60.0


class TaskBook:
    """The ``last_run_at``/``total_run_count`` a replica's committed claims owe the task rows.

    ``add`` merges a committed claim's updates (task id -> ``TaskUpdate``); ``step`` writes them
    when ``EVERY`` seconds have passed since the last write, ``flush`` at once. A failed write
    keeps them for the next (logged, action ``bookkeeping_failed``). ``clock`` gives monotonic
    seconds.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._owed: dict[int, TaskUpdate] = {}
        self._written = clock()

    def __len__(self) -> int:
        return len(self._owed)

    def add(self, updates: dict[int, TaskUpdate]) -> None:
        """Owe ``updates``: runs add up, the newest slot and a disable win."""
        for pk, update in updates.items():
            owed = self._owed.setdefault(pk, TaskUpdate())
            owed.runs += update.runs
            owed.disable = owed.disable or update.disable
            if update.last_slot is not None and (
                owed.last_slot is None or update.last_slot > owed.last_slot
            ):
                owed.last_slot = update.last_slot

    def step(self, using: str = "default") -> None:
        """``flush`` when ``EVERY`` seconds have passed since the last write; never raises."""
        if self._clock() - self._written >= EVERY:
            self.flush(using)

    def flush(self, using: str = "default") -> bool:
        """Write what is owed in one transaction; return whether it was written (or nothing was
        owed). A database error is logged and the updates are kept; it never raises."""
        self._written = self._clock()
        if not self._owed:
            return True
        owed, self._owed = self._owed, {}
        try:
            with transaction.atomic(using=using):
                update_tasks(owed, using)
        except Exception:  # bookkeeping must never stop a replica
            logger.exception(
                "cannot write last_run_at/total_run_count of %d tasks; kept for the next try",
                len(owed), extra={"action": "bookkeeping_failed"},
            )
            self.add(owed)
            return False
        return True
