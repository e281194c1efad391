"""Whether a worker process reaches the database: one log line when it loses it, one when back.

A worker's pool process touches the ledger at each run's start (the guard) and end (the
outcome); while the database is away (a restart, a failover) every message would log its own
error. ``DatabaseReach`` keeps the state per process: the first failure logs one ERROR naming the
server last reached (``host:port``; with several servers in the settings, libpq's choice), the
first success after it one WARNING naming the server reached now (after a failover, the promoted
standby) and how long it was away; the failures in between log at debug. The replicas log their
own pair of lines (``schedulers.LedgerScheduler``).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from scheduling.ledger.session import server_address

logger = logging.getLogger(__name__)


class DatabaseReach:
    """This process's view of the database: reached, or lost since a monotonic instant."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._lost_since: float | None = None
        self._address = ""
        self._pid = os.getpid()

    def _fork_safe(self) -> None:
        if self._pid != os.getpid():  # a pool process starts with its parent's state
            self._lost_since, self._address, self._pid = None, "", os.getpid()

    def reached(self, using: str = "default", session: str = "") -> None:
        """Note a statement that succeeded on ``using``, or on the session at ``session``
        (``host:port`` of the guard's own session, which the caller names); log the return
        after an outage."""
        address = session or server_address(using)
        with self._mutex:
            self._fork_safe()
            self._address = address or self._address
            if self._lost_since is None:
                return
            away = time.monotonic() - self._lost_since
            self._lost_since = None
        logger.warning(
            "worker process %d reached the database again at %s after %.1f s",
            os.getpid(), self._address or "?", away, extra={"action": "database_back"},
        )

    def lost(self, exc: BaseException, using: str = "default") -> bool:
        """Note a failure; log it when it starts an outage. Return whether it did."""
        error = " ".join(str(exc).split()) or type(exc).__name__
        address = server_address(using)
        with self._mutex:
            self._fork_safe()
            first = self._lost_since is None
            if first:
                self._lost_since = time.monotonic()
            where = address or self._address or "no server yet"
        if first:
            logger.error(
                "worker process %d lost the database (connected to %s): %s; runs wait until it "
                "is back (messages requeued, outcomes retried)", os.getpid(), where, error,
                extra={"action": "database_lost"},
            )
        else:
            logger.debug("database still unreachable: %s", error)
        return first


#: The one instance of this process (each pool process has its own after the fork).
database = DatabaseReach()
