"""The periodic tasks' bookkeeping columns, owed by each claim and settled in batches: ``TaskBook``.

django-celery-beat shows ``last_run_at`` and ``total_run_count`` on each task; stock beat keeps
them in memory and writes them back every few minutes (its ``sync``). A claim wrote them in its
own transaction, one row version per task per claim: with a task due every second, every row of
``django_celery_beat_periodictask`` gained a version a second, and the claim, which reads those
rows, walked their chains whenever a long transaction elsewhere kept vacuum from removing them
(the benchmark's MVCC horizon: 2,000 runs/s catching up, the claim 3.3x slower after two minutes,
2.5x fewer runs dispatched per second).

So a claim owes them instead: one INSERT in its transaction (``owe``: a row of
``OwedRunCount`` per task, its runs and newest slot), durable with the dispatches it counts. Every
``EVERY`` seconds, and at a clean stop, a replica settles what is owed, its own claims' and any
other replica's, dead or alive (``settle``: one statement moves the rows onto the task rows and
deletes them; a row another settle holds is skipped, so none is counted twice). A replica killed
at any instant loses nothing: its committed claims' rows wait for the next settle, of any replica.
A claim that ends a task's schedule (a one-off run, an expired task) still writes that task's row
itself: ``enabled`` must turn off with the commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import connections, transaction

from scheduling.ledger.writes import TaskUpdate
from scheduling.sql import compose, queries

logger = logging.getLogger(__name__)

#: Seconds between two settles of a replica. Each settle is a version of every task row dispatched
#: for since the last, which the claim's join reads until vacuum may remove it: with 5 s, two
#: replicas and a 10-minute transaction open elsewhere, 240 versions a row, and the claim read
#: 20,361 buffers where it read 1,830 (bench mvcc_horizon). Stock beat writes them every 3 minutes
#: (``DatabaseScheduler.sync_every``). So the task rows lag the ledger by up to this much.
EVERY = 60.0


class TaskBook:
    """A replica's share of the bookkeeping: what its claims owe, and when it settles.

    ``owe`` records a claim's runs in the claim's transaction; ``step`` settles when ``EVERY``
    seconds have passed since this book last did (at its first step at once: what killed
    replicas owed is counted as soon as a replica starts), ``settle`` at once. ``clock`` gives
    monotonic seconds.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._settled: float | None = None

    def owe(self, updates: dict[int, TaskUpdate], using: str = "default") -> None:
        """Record the runs of ``updates`` (task id -> ``TaskUpdate``) as owed: one INSERT.

        Called inside the claim's transaction, so the rows commit or roll back with the runs they
        count; updates without a dispatched run owe nothing. Database errors propagate (they roll
        the claim back, as any of its statements would).
        """
        owed = sorted(pk for pk, update in updates.items() if update.runs)
        if not owed:
            return
        with connections[using].cursor() as cursor:
            cursor.execute(
                queries["owe_run_counts"],
                [
                    compose.array(owed),
                    compose.array([updates[pk].runs for pk in owed]),
                    compose.array([updates[pk].last_slot for pk in owed]),
                ],
            )

    def step(self, using: str = "default") -> None:
        """``settle`` at the first call and when ``EVERY`` seconds have passed since the last;
        never raises."""
        if self._settled is None or self._clock() - self._settled >= EVERY:
            self.settle(using)

    def settle(self, using: str = "default") -> int | None:
        """Add what every replica's committed claims owe to the task rows, in one transaction.

        ``total_run_count`` grows by the owed runs, ``last_run_at`` becomes the newest owed slot
        unless it is newer already. Returns how many task rows were updated, or None when the
        database refused (logged, action ``bookkeeping_failed``: the rows stay owed for the next
        settle); it never raises.
        """
        self._settled = self._clock()
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                cursor.execute(queries["settle_run_counts"])
                return len(cursor.fetchall())
        except Exception:  # bookkeeping must never stop a replica
            logger.exception(
                "cannot settle last_run_at/total_run_count; they stay owed for the next try",
                extra={"action": "bookkeeping_failed"},
            )
            return None
