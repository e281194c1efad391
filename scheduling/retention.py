"""How long finished runs are kept: the scheduler's optional built-in prune.

The deleting itself is ``ledger.prune_plan`` / ``ledger.prune_batch``; ``manage.py
scheduling_prune`` is the command. The built-in prune (``SCHEDULING_PRUNE_OLDER_THAN``, off by
default) runs in every replica every ``SCHEDULING_PRUNE_INTERVAL`` seconds, one small batch per
idle tick, never inside a claim transaction.
"""

from __future__ import annotations

import logging
import time

from scheduling import ledger
from scheduling.conf import conf

logger = logging.getLogger(__name__)


class BuiltinPrune:
    """The scheduler's periodic prune: one batch per ``step()``, a pass per interval.

    A pass plans (``ledger.prune_plan``) and then deletes ``SCHEDULING_PRUNE_BATCH_SIZE`` runs per
    step until a batch comes back short; the next pass starts ``SCHEDULING_PRUNE_INTERVAL``
    seconds after this one started. Errors are logged and end the pass; dispatching goes on.
    """

    def __init__(self) -> None:
        self._next_pass = 0.0  # the first pass on the first idle tick
        self._plan: ledger.PrunePlan | None = None
        self._after = 0

    def step(self) -> None:
        """Do one batch of the built-in prune when it is configured and due; else nothing."""
        older_than = conf.prune_older_than
        if older_than is None:
            return
        now = time.monotonic()
        if self._plan is None and now < self._next_pass:
            return
        try:
            if self._plan is None:
                self._next_pass = now + conf.prune_interval  # a failing pass waits its turn too
                self._plan = ledger.prune_plan(older_than, conf.prune_keep_last)
                self._after = 0
            counts, after = ledger.prune_batch(self._plan, self._after, conf.prune_batch_size)
        except Exception:  # pruning must never stop a replica
            logger.exception("built-in prune failed", extra={"action": "prune_failed"})
            self._plan = None
            return
        if counts:
            logger.info(
                "built-in prune deleted %d runs: %s", sum(counts.values()), counts,
                extra={"action": "prune"},
            )
        if after is None or sum(counts.values()) < conf.prune_batch_size:
            self._plan = None
        else:
            self._after = after
