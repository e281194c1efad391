"""How long finished runs are kept: the scheduler's optional built-in prune.

The deleting itself is ``ledger.prune_plan`` / ``ledger.prune_batch``; ``manage.py
scheduling_prune`` is the command. The built-in prune (``SCHEDULING_PRUNE_OLDER_THAN``, off by
default) runs in every replica every ``cadences.PRUNE_INTERVAL`` seconds, one small batch per
idle tick, never inside a claim transaction; on a replica that is never idle (a run due at every
tick), one batch at most every tenth of its time (``BUSY_SHARE``), each sized to take about
``BUSY_BATCH_SECONDS``, so the ledger stays flat under steady load and no claim waits long for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from scheduling import cadences, ledger
from scheduling.conf import conf

logger = logging.getLogger(__name__)

#: The most of a busy replica's time the built-in prune takes: a batch that started at t and
#: took d seconds lets a busy tick step again at t + d / BUSY_SHARE. Idle ticks step
#: whenever a pass is under way. Without it a replica with a run due at every tick never pruned
#: (the benchmark's day ledger at 1,000 runs/s grew without bound).
BUSY_SHARE = 0.1

#: How long a busy replica's batch aims to take, in seconds: the claim right after it waits that
#: long. Each busy batch's size is the last one's scaled by this over the time it took, at most
#: twice the last size, between ``cadences.PRUNE_BATCH_SIZE`` / 25 (at least 1) and
#: ``cadences.PRUNE_BATCH_SIZE``. A fixed 500 took about 10 ms at 1,000 runs/s on two cores,
#: and the busy replica's lateness p99 was 1.37x that of no prune (the benchmark's day ledger).
BUSY_BATCH_SECONDS = 0.002


class BuiltinPrune:
    """The scheduler's periodic prune: one batch per ``step()``, a pass per interval.

    A pass plans (``ledger.prune_plan``) and then deletes ``cadences.PRUNE_BATCH_SIZE`` runs per
    step until a batch comes back short; the next pass starts ``cadences.PRUNE_INTERVAL``
    seconds after this one started. Errors are logged and end the pass; dispatching goes on.
    ``clock`` gives monotonic seconds (``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next_pass = 0.0  # the first pass on the first tick
        self._rest_until = 0.0  # a busy tick's next step, after the last batch (BUSY_SHARE)
        self._plan: ledger.PrunePlan | None = None
        self._after = 0
        self._busy_size = 0  # the next busy batch's size; 0: the smallest, not yet measured

    def step(self, busy: bool = False) -> None:
        """Do one batch of the built-in prune when it is configured and due; else nothing.

        ``busy``: the replica has runs due now (it will claim right after); the batch is then
        done only when the prune has rested long enough to stay within ``BUSY_SHARE``, and its size
        follows the last busy batch's time (``BUSY_BATCH_SECONDS``).
        """
        older_than = conf.prune_older_than
        if older_than is None:
            return
        now = self._clock()
        if self._plan is None and now < self._next_pass:
            return
        if busy and now < self._rest_until:
            return
        size = cadences.PRUNE_BATCH_SIZE
        if busy:
            size = min(size, max(self._busy_size, size // 25, 1))
        planned = self._plan is None  # the batch's time then holds the plan's too
        deleted = 0
        try:
            deleted = self._batch(older_than, size, now)
        finally:
            took = self._clock() - now
            self._rest_until = now + took / BUSY_SHARE
        if busy and not planned and deleted == size:  # a short batch ends the pass: time unknown
            self._busy_size = round(min(2 * size, size * BUSY_BATCH_SECONDS / max(took, 1e-6)))

    def _batch(self, older_than: timedelta, size: int, now: float) -> int:
        """Plan a pass when none is under way, then delete one batch of ``size`` runs of it.

        Returns how many runs it deleted (0 after an error, which is logged).
        """
        try:
            if self._plan is None:
                self._next_pass = now + cadences.PRUNE_INTERVAL  # a failing pass waits its turn too
                self._plan = ledger.prune_plan(older_than, conf.prune_keep_last)
                self._after = 0
            counts, after = ledger.prune_batch(self._plan, self._after, size)
        except Exception:  # pruning must never stop a replica
            logger.exception("built-in prune failed", extra={"action": "prune_failed"})
            self._plan = None
            return 0
        if counts:
            logger.info(
                "built-in prune deleted %d runs: %s", sum(counts.values()), counts,
                extra={"action": "prune"},
            )
        deleted = sum(counts.values())
        if after is None or deleted < size:
            self._plan = None
        else:
            self._after = after
        return deleted
