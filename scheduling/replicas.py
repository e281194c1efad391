"""Replica heartbeats: each beat replica's row in ``Replica``, for display and health probes only.

Nothing that decides what runs reads these rows (the claim is a row lock, not a lease), so a
heartbeat is written at most every ``cadences.HEARTBEAT_INTERVAL`` seconds, as one statement in
autocommit after the tick's claim transaction has ended, and a failed heartbeat is logged and
dropped: it never delays or stops scheduling. Times are the database clock (``clock_timestamp()``),
so a replica with a skewed clock is not shown stale.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta

from django.db import connections
from django.db.models import Case, CharField, F, FloatField, Q, QuerySet, Value, When
from django.db.models.functions import Extract

from scheduling import cadences
from scheduling.clock import ClockTimestamp
from scheduling.models import Replica
from scheduling.sql import queries

logger = logging.getLogger(__name__)

#: A replica is shown stale after this many heartbeat intervals without a tick.
STALE_AFTER_INTERVALS = 3
#: Rows of replicas that have not ticked for this long are deleted when a replica starts.
RETENTION = timedelta(days=7)

class Heartbeat:
    """The heartbeat of one replica process; ``LedgerScheduler`` owns one.

    ``claimed(n)`` counts runs claimed since the last write; ``beat()`` writes the row when the
    interval has passed (the first call registers the replica: host, pid, ``started_at``, a
    zeroed count); ``stop()`` records a clean shutdown. None of them raises: a database error is
    logged (a warning for the first of a series, then debug) and the next write is tried one
    interval later, with the unwritten count kept. ``clock`` is a monotonic clock in seconds.
    """

    def __init__(
        self,
        replica_id: str,
        *,
        using: str = "default",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replica_id = replica_id
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._using = using
        self._clock = clock
        self._unwritten = 0
        self._last_try: float | None = None
        self._registered = False
        self._failing = False

    def claimed(self, runs: int) -> None:
        """Count ``runs`` claimed by this replica; written with the next heartbeat."""
        self._unwritten += runs

    def beat(self) -> bool:
        """Write the heartbeat if one interval has passed since the last try; return if written."""
        now = self._clock()
        if self._last_try is not None and now - self._last_try < cadences.HEARTBEAT_INTERVAL:
            return False
        self._last_try = now
        params = [self.replica_id, self.host, self.pid, self._unwritten]
        try:
            with connections[self._using].cursor() as cursor:
                if not self._registered:
                    cursor.execute(queries["replica_prune"], [RETENTION])
                statement = queries["replica_tick" if self._registered else "replica_start"]
                cursor.execute(statement, params)
        except Exception as exc:  # noqa: BLE001 - display only: never let it touch scheduling
            self._log_failure(exc)
            return False
        self._registered, self._failing, self._unwritten = True, False, 0
        return True

    def stop(self) -> None:
        """Mark the replica stopped (a clean shutdown); nothing when it never registered."""
        if not self._registered:
            return
        try:
            with connections[self._using].cursor() as cursor:
                cursor.execute(
                    queries["replica_stop"], [self._unwritten, self.replica_id, self.pid]
                )
        except Exception as exc:  # noqa: BLE001 - shutting down: log and go
            self._log_failure(exc)
            return
        # Celery's SIGTERM handler closes the scheduler and beat's own exit closes it again.
        self._unwritten = 0

    def _log_failure(self, exc: Exception) -> None:
        log = logger.debug if self._failing else logger.warning
        log(
            "heartbeat of replica %s not written (display only; scheduling goes on): %s",
            self.replica_id, exc, extra={"action": "heartbeat_failed"},
        )
        self._failing = True


def stale_after() -> timedelta:
    """How long without a tick before a running replica is shown stale (3 heartbeat intervals)."""
    return timedelta(seconds=STALE_AFTER_INTERVALS * cadences.HEARTBEAT_INTERVAL)


def with_state(replicas: QuerySet[Replica]) -> QuerySet[Replica]:
    """Annotate ``tick_age`` (seconds since the last tick, database clock) and ``state``.

    ``state`` is ``"stopped"`` after a clean shutdown, ``"stale"`` when the last tick is older
    than ``stale_after()``, else ``"live"``.
    """
    return replicas.annotate(
        tick_age=Extract(ClockTimestamp() - F("last_tick_at"), "epoch", output_field=FloatField()),
        state=Case(
            When(stopped_at__isnull=False, then=Value("stopped")),
            When(Q(last_tick_at__lt=ClockTimestamp() - stale_after()), then=Value("stale")),
            default=Value("live"),
            output_field=CharField(),
        ),
    )
