"""The due floor: where a replica's poll and claim start their scans of the pending runs.

The poll and the claim read the partial index ``scheduling_run_pending_due`` in ``due_at``
order from its first entry. A claimed run leaves the index's predicate, but its entry stays
until vacuum removes the old row version, and vacuum may not while any transaction older than
the claim is open (a report, a backup, an idle-in-transaction session: the MVCC horizon). Every
scan then reads every run claimed since that transaction began, checks each row version and
skips it: at 500 runs/s, 300,000 of them after ten minutes, every tick.

A replica keeps a floor instead: after a poll that read the whole index (``full``), no pending
run was due before the earlier of the earliest pending run's due moment and that poll's clock;
the next polls and claims start their scans there, and skip the entries below it. A run can
come to be pending below the floor after that poll: one planned into the past (a backfill, a
catching-up re-plan, a jitter longer than the interval), or committed by a transaction that was
open during the poll. So the floor holds for ``REFRESH`` seconds, and is dropped at once after
the replica's own reconcile pass: the next poll reads the whole index again. Such a run is found
that much later at most; a run planned due now or later (the next slot, a run-now) is above
every floor and found at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

#: Seconds a floor holds before a poll reads the whole index again.
REFRESH = 1.0


class DueFloor:
    """A replica's due floor (module doc). ``clock`` gives monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._value: datetime | None = None
        self._set_at = 0.0

    @property
    def value(self) -> datetime | None:
        """The floor (aware UTC datetime), or None when the next poll must read the whole index."""
        if self._value is not None and self._clock() - self._set_at >= REFRESH:
            self._value = None
        return self._value

    def seen(self, now: datetime, next_due: datetime | None, full: bool) -> None:
        """Take a poll's clock and earliest due moment; only a full poll sets the floor."""
        if full:
            self._value = now if next_due is None else min(now, next_due)
            self._set_at = self._clock()

    def drop(self) -> None:
        """Forget the floor: the next poll reads the whole index (after a reconcile pass)."""
        self._value = None
