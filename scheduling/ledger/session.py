"""The scheduler's database session: its server-side bounds, the poll, the advisory locks, the stop.

A replica's session carries ``idle_in_transaction_session_timeout``, ``statement_timeout`` and TCP
keepalives (invariant 8: a frozen or partitioned replica cannot hold its claim longer than the
server allows). Through a pooler by transaction (``pooler``) the timeouts are set per transaction
instead. Two advisory locks order work between replicas: the reconcile turn (session level, on
``SCHEDULING_DIRECT_DATABASE``) and the ``CELERY_BEAT_SCHEDULE`` sync (transaction level).
Neither is needed for correctness; they keep replicas from doing the same work at once. A stop
may come at any instant (``ready_for_stop``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.db import connections, transaction
from psycopg import pq

from scheduling import cadences
from scheduling.conf import conf
from scheduling.ledger import pooler
from scheduling.ledger.timestamps import use_compiled_timestamps
from scheduling.sql import BEAT_SCHEDULE_LOCK, RECONCILE_LOCK, queries

logger = logging.getLogger(__name__)

#: The floor of a scan that starts at the first entry (before every due moment).
NO_FLOOR = datetime(1, 1, 2, tzinfo=UTC)


@dataclass(frozen=True)
class Poll:
    """One look at the ledger: the database clock, the earliest pending run, the edit marker."""

    now: datetime
    next_due: datetime | None
    change_marker: datetime | None

    def seconds_until_due(self) -> float | None:
        """Seconds from ``now`` until the earliest pending run (<= 0 when one is due)."""
        if self.next_due is None:
            return None
        return (self.next_due - self.now).total_seconds()


@dataclass(frozen=True)
class Keepalives:
    """TCP keepalive and user-timeout settings of a session, from ``cadences.TCP_KEEPALIVES_IDLE``.

    ``idle``, ``interval``: seconds; ``count``: probes. ``bound`` (seconds) is how long an end of
    the connection waits for a silent peer before it gives up: ``idle + count * interval`` when
    nothing it sent is unacknowledged (the keepalive probes), and the same ``tcp_user_timeout``
    when something is (a reply lost in a partition, where keepalives never start and the
    retransmissions would last about 15 minutes). Defaults: 5 + 3 x 2 = 11 s. See
    docs/outages.md, "Network partitions".
    """

    idle: int
    interval: int
    count: int = 3

    @property
    def bound(self) -> int:
        """Seconds after which a silent peer's connection is given up."""
        return self.idle + self.count * self.interval

    def server_settings(self) -> list[str]:
        """``tcp_keepalives_idle``, ``_interval``, ``_count``, ``tcp_user_timeout`` values."""
        return [str(self.idle), str(self.interval), str(self.count), str(self.bound * 1000)]

    def client_parameters(self) -> dict[str, int]:
        """The same bounds as libpq connection parameters (ignored on a Unix socket)."""
        return {
            "keepalives": 1, "keepalives_idle": self.idle, "keepalives_interval": self.interval,
            "keepalives_count": self.count, "tcp_user_timeout": self.bound * 1000,
        }


def keepalives() -> Keepalives:
    """Return the keepalive settings of the scheduler's and the guard's sessions (interval: half
    of ``cadences.TCP_KEEPALIVES_IDLE``, at least 1 s)."""
    idle = cadences.TCP_KEEPALIVES_IDLE
    return Keepalives(idle=idle, interval=max(1, idle // 2))


def configure_session(using: str = "default") -> None:
    """Apply the scheduler's server-side bounds to its connections, once per connection.

    ``idle_in_transaction_session_timeout`` and ``statement_timeout`` bound how long a frozen or
    partitioned replica can hold its claim (invariant 8, docs/architecture.md); the TCP keepalive
    and user-timeout settings (``Keepalives``) let the server notice a vanished client, the
    session-level reconcile turn included. ``application_name`` is
    ``scheduling-beat:<replica id>`` (cut to 63 bytes), so ``pg_stat_activity`` shows which
    session is which replica's. The connection of the reconcile turn
    (``SCHEDULING_DIRECT_DATABASE``) gets them too, when it is another one.

    On a connection through a pooler (``pooler.pooled``) no session setting is made: it would stay
    on the pooler's server session, for its next client, and miss the next transaction. There the
    first statement of every transaction sets the two timeouts and the name for that transaction
    (``set_config(..., true)``: one round trip more per transaction), and keepalives are the
    pooler's own (PgBouncer's ``tcp_keepalive`` settings). Whether the claim may be prepared there
    is asked now, outside any transaction (``pooler.keeps_prepared``). Timestamps are read with
    psycopg's compiled loader where the session is in UTC (``timestamps``).
    """
    _configure(using)
    if conf.direct_database != using:
        _configure(conf.direct_database)


def _configure(using: str) -> None:
    connection = connections[using]
    connection.ensure_connection()
    raw = connection.connection
    if getattr(connection, "_scheduling_session", None) is raw:
        return
    use_compiled_timestamps(raw, connection.timezone)
    if pooler.pooled(using):
        if _bounds_per_transaction not in connection.execute_wrappers:
            connection.execute_wrappers.append(_bounds_per_transaction)
        prepared = conf.prepared_claim and pooler.keeps_prepared(using)
        logger.info(
            "database alias %r goes through a connection pooler: the scheduler's timeouts are set "
            "per transaction; claims are sent %s", using,
            "prepared (the pooler keeps prepared statements)" if prepared else "unprepared",
            extra={"action": "pooled_session"},
        )
        if using == conf.direct_database:
            pooler.report_pooled_locks(using, "a replica's reconcile turn")
    else:
        if _bounds_per_transaction in connection.execute_wrappers:  # was pooled, now direct
            connection.execute_wrappers.remove(_bounds_per_transaction)
        with connection.cursor() as cursor:
            cursor.execute(
                queries["session_bounds"],
                [
                    f"{int(cadences.IDLE_IN_TRANSACTION_TIMEOUT * 1000)}ms",
                    f"{int(cadences.STATEMENT_TIMEOUT * 1000)}ms",
                    *keepalives().server_settings(),
                    application_name(conf.replica_id),
                ],
            )
    connection._scheduling_session = raw  # type: ignore[attr-defined]


def _bounds_per_transaction(
    execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """Django execute wrapper: the bounds of ``transaction_bounds`` first in each transaction.

    A statement is the first of its transaction when Django is inside ``atomic`` and psycopg has
    not begun one yet (it begins it with this statement). Sent unprepared, whatever the cursor.
    """
    connection = context["connection"]
    if (
        connection.in_atomic_block
        and connection.connection.info.transaction_status == pq.TransactionStatus.IDLE
    ):
        context["cursor"].cursor.execute(
            queries["transaction_bounds"],
            [
                f"{int(cadences.IDLE_IN_TRANSACTION_TIMEOUT * 1000)}ms",
                f"{int(cadences.STATEMENT_TIMEOUT * 1000)}ms",
                application_name(conf.replica_id),
            ],
            prepare=False,
        )
    return execute(sql, params, many, context)


def close_sessions(using: str = "default") -> None:
    """Close the scheduler's connections (after an outage): the next tick opens new ones.

    Never raises: a broken connection is closed all the same.
    """
    for alias in {using, conf.direct_database}:
        try:
            connections[alias].close()
        except Exception:  # noqa: BLE001 - the connection is already broken
            pass


def server_address(using: str = "default") -> str:
    """Return ``host:port`` of the server ``using``'s open connection is on, "" without one.

    With several servers in the settings (a primary and its standbys, ``target_session_attrs``)
    this names the one libpq chose. No query: libpq's record of the connection, readable on a
    connection the server has just dropped too. Never raises.
    """
    raw = connections[using].connection
    if raw is None:
        return ""
    try:
        return f"{raw.info.host}:{raw.info.port}"
    except Exception:  # noqa: BLE001 - closed: no address to tell
        return ""


def application_name(replica_id: str) -> str:
    """Return the ``application_name`` of replica ``replica_id``'s scheduler session."""
    return f"scheduling-beat:{replica_id}".encode()[:63].decode(errors="ignore")


def poll(using: str = "default", floor: datetime | None = None) -> Poll:
    """Return the database clock, the earliest pending run's slot and the edit marker, in one query.

    This is the whole cost of an idle tick, whatever the number of periodic tasks: the earliest
    pending run is the first entry of the partial index on pending runs (``ORDER BY ... LIMIT 1``
    reads one entry whatever the table's statistics say; ``min()`` may be planned as a scan of
    the whole index while the statistics are stale). With ``floor`` (aware datetime: a replica's
    ``DueFloor``) the scan starts there, and runs due before it are not seen.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(queries["poll"], [floor or NO_FLOOR])
        now, next_due, marker = cursor.fetchone()
    return Poll(now=now, next_due=next_due, change_marker=marker)


@contextmanager
def reconcile_turn(using: str | None = None) -> Iterator[bool]:
    """Yield whether this replica may reconcile now: no other replica is reconciling.

    ``pg_try_advisory_lock`` on ``scheduling.sql.RECONCILE_LOCK`` (session level, released on
    exit or when the session ends, a killed replica included): replicas that see the same edit
    re-plan it one after another, not all at once, and the others go on dispatching meanwhile. A
    session-level lock outlives no session, but nothing ends a session that is frozen between
    transactions: the scheduler bounds its wait (``schedulers.TURN_PATIENCE``). The lock is taken
    on ``using``, by default ``SCHEDULING_DIRECT_DATABASE``: a pooler by transaction would leave
    it on a server session the replica may never be lent again.
    """
    alias = using or conf.direct_database
    with connections[alias].cursor() as cursor:
        cursor.execute(queries["try_advisory_lock"], [RECONCILE_LOCK])
        mine = cursor.fetchone()[0]
    try:
        yield mine
    except BaseException:
        if mine:
            _release_turn(alias, unwinding=True)
        raise
    if mine:
        _release_turn(alias, unwinding=False)


def _release_turn(alias: str, unwinding: bool) -> None:
    """Release the reconcile turn; while an exception unwinds the pass, never replace it.

    A stop's SystemExit can leave the session with the interrupted statement's result unread
    (psycopg then refuses any statement: "another command is already in progress"); raising that
    here would replace the SystemExit, and beat would go on ticking, never stopping. The turn is
    then freed when the stop closes the session (``ready_for_stop``), or by the next unlock.
    """
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute(queries["advisory_unlock"], [RECONCILE_LOCK])
    except Exception as exc:  # noqa: BLE001 - the exception in flight is the one to raise
        if not unwinding:
            raise
        logger.info(
            "reconcile turn not released while unwinding (%s); the session's end frees it", exc,
            extra={"action": "turn_release_deferred"},
        )


@contextmanager
def beat_schedule_sync(using: str = "default") -> Iterator[None]:
    """Run the body in one transaction that holds the beat_schedule sync lock.

    ``pg_advisory_xact_lock`` makes replicas starting at once sync ``CELERY_BEAT_SCHEDULE`` one
    after another: the first creates the periodic tasks and schedule rows, the others find them
    and write nothing (django-celery-beat's schedule rows have no unique constraint, so without it
    concurrent replicas create duplicates and then keep moving tasks between them). The lock ends
    with the transaction (commit, rollback or a dead connection); the body should use a savepoint
    (``transaction.atomic``) per entry so one bad entry does not roll back the others.
    """
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute(queries["advisory_xact_lock"], [BEAT_SCHEDULE_LOCK])
        yield


def ready_for_stop(using: str = "default") -> bool:
    """Make the scheduler's session fit for a stop at any instant; return whether to write on it.

    Celery beat's SIGTERM and SIGINT handler (``celery/apps/beat.py``, ``_sync``) closes the
    scheduler wherever the main thread was, then raises ``SystemExit`` there; beat closes it again
    once that has unwound (``celery/beat.py``, ``Service.start``'s ``finally``). The stop finds the
    session in one of these states:

    - inside a psycopg call the signal interrupted (below the handler, on the same thread), which
      holds psycopg's connection lock: a statement sent now would wait for that lock for ever.
      The call's statement in flight, if any, is cancelled (a cancel request on a side
      connection, psycopg's ``cancel_safe``, at most ``cadences.STATEMENT_TIMEOUT`` s), so the
      call ends as soon as the ``SystemExit`` reaches it, without waiting for a lock or the
      statement timeout: False.
    - inside a transaction: a write now would be rolled back with it when the ``SystemExit``
      unwinds it (a claim never is: ``schedulers._stop_signals_deferred`` holds the signals):
      False.
    - a statement left in flight by an interrupted call that has unwound (psycopg before 3.3
      does not read the cancelled result on ``SystemExit``), or a broken session: the statement
      is cancelled and the session closed, which frees its advisory locks (the reconcile turn
      too, unless it is on a ``SCHEDULING_DIRECT_DATABASE`` of its own, where the unwinding pass
      releases it), and a new one is opened with the scheduler's bounds: True.
    - idle, or not connected: True.

    Never raises: a stop goes on whatever the database does.
    """
    connection = connections[using]
    raw: psycopg.Connection[Any] | None = connection.connection
    if raw is None or raw.closed:
        return True
    status = raw.info.transaction_status
    if status == pq.TransactionStatus.ACTIVE:
        _cancel(raw)
    if raw.lock.locked():
        return False
    if status not in (pq.TransactionStatus.ACTIVE, pq.TransactionStatus.UNKNOWN):
        return status == pq.TransactionStatus.IDLE and not connection.in_atomic_block
    try:
        connection.close()
        configure_session(using)
    except Exception as exc:  # noqa: BLE001 - stopping: log and go
        logger.warning(
            "cannot open a new scheduler session to record the stop: %s", exc,
            extra={"action": "stop_session_failed"},
        )
        return False
    return True


def _cancel(raw: psycopg.Connection[Any]) -> None:
    """Ask the server to cancel ``raw``'s statement in flight, waiting at most the timeout."""
    try:
        raw.cancel_safe(timeout=cadences.STATEMENT_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - the statement timeout ends it anyway
        logger.warning(
            "cannot cancel the scheduler's statement in flight: %s", exc,
            extra={"action": "stop_cancel_failed"},
        )
        return
    logger.info(
        "stopping: cancelled the scheduler's statement in flight",
        extra={"action": "stop_cancelled"},
    )
