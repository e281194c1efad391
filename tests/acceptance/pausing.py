"""A beat replica that stays inside its claim transaction after publishing, for the tests.

    celery -A project beat -S tests.acceptance.pausing:PausingScheduler

``Deployment.start_beat(name, pause_after_publish=N)`` starts one (the folder above ``tests``
must be the replica's working directory). Each claim that claimed runs publishes them and writes
the ledger as ``LedgerScheduler`` does, then logs ``test pause: published <task ids>, sleeping
N.Ns before commit`` and sleeps N seconds before it commits, so a test can SIGKILL, SIGSTOP or
SIGTERM the replica between publish and commit.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import transaction

from scheduling import ledger
from scheduling.schedulers import LedgerScheduler

logger = logging.getLogger(__name__)

#: The environment variable that gives the pause, in seconds.
PAUSE_VARIABLE = "TEST_PAUSE_AFTER_PUBLISH"


class PausingScheduler(LedgerScheduler):
    """``LedgerScheduler`` whose claims sleep ``TEST_PAUSE_AFTER_PUBLISH`` s before committing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.pause_after_publish = float(os.environ.get(PAUSE_VARIABLE) or 0)
        super().__init__(*args, **kwargs)

    def _claim(self, grace: timedelta, flush: Callable[[], None]) -> list[ledger.Dispatched]:
        """Claim as ``LedgerScheduler`` does inside an outer transaction, then sleep in it.

        The ledger's transaction becomes a savepoint of this one: when it is released every
        message has been flushed to the broker and the ledger written, and the row locks are
        held until the outer transaction commits after the pause.
        """
        if not self.pause_after_publish:
            return super()._claim(grace, flush)
        with transaction.atomic():
            dispatched = super()._claim(grace, flush)
            if dispatched:
                logger.warning(
                    "test pause: published %s, sleeping %.1fs before commit",
                    ",".join(run.task_id for run in dispatched), self.pause_after_publish,
                    extra={"action": "test_pause", "replica": self.replica_id},
                )
                time.sleep(self.pause_after_publish)
        return dispatched
