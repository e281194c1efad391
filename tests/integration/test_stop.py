"""A stop at any instant: ``ledger.ready_for_stop`` and ``LedgerScheduler.close`` (issue 14).

Celery's SIGTERM handler closes the scheduler wherever the main thread was, then beat closes it
again once the handler's SystemExit has unwound. Here the interrupted statement is made by hand:
sent with libpq (``send_query``) while psycopg's connection lock is held, as it is by the call a
signal interrupts; or with the lock free, as an unwound call leaves it on psycopg before 3.3.
"""

from __future__ import annotations

import time
from typing import Any
from unittest.mock import patch

import psycopg
import pytest
from django.db import connection, transaction
from psycopg import pq

from project.celery import app
from scheduling import cadences, ledger
from scheduling.conf import conf
from scheduling.models import Replica
from scheduling.schedulers import LedgerScheduler
from scheduling.sql import RECONCILE_LOCK
from tests.acceptance.deployment import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

STATEMENT_TIMEOUT = 10.0


def _send(raw: psycopg.Connection[Any], sql: str, observer: psycopg.Connection[Any]) -> int:
    """Send ``sql`` on ``raw`` without reading its result; return the session's backend pid.

    Returns once the server runs it (seen from ``observer``): a cancel request that reaches a
    backend still reading the statement is ignored.
    """
    raw.pgconn.send_query(sql.encode())
    assert raw.info.transaction_status == pq.TransactionStatus.ACTIVE
    pid = raw.info.backend_pid

    def running() -> bool:
        row = observer.execute(
            "SELECT state = 'active' AND query = %s FROM pg_stat_activity WHERE pid = %s",
            [sql, pid],
        ).fetchone()
        observer.commit()
        return bool(row and row[0])

    wait_until(running, timeout=10)
    return pid


def _read_result(raw: psycopg.Connection[Any]) -> str:
    """Read what the statement sent by ``_send`` gave: its SQLSTATE ("" on success)."""
    states = []
    while (result := raw.pgconn.get_result()) is not None:
        states.append((result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode())
    return "".join(states)


def _stopped_at(raw_connection: psycopg.Connection[Any], replica_id: str) -> object:
    row = raw_connection.execute(
        "SELECT stopped_at FROM scheduling_replica WHERE id = %s", [replica_id]
    ).fetchone()
    raw_connection.commit()
    return row[0]


@patch.multiple(cadences, STATEMENT_TIMEOUT=STATEMENT_TIMEOUT)
def test_close_mid_statement_cancels_it_at_once_and_the_next_close_records_the_stop(
    raw_connection,
):
    connection.close()  # a new session, configured with this test's statement timeout
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # registers the replica
    raw = connection.connection
    raw.lock.acquire()  # held by the call the signal interrupted
    try:
        _send(raw, "SELECT pg_sleep(60)", raw_connection)
        started = time.monotonic()
        scheduler.close()  # Celery's handler: must not wait for the lock or the statement
    finally:
        raw.lock.release()
    # query_canceled, well before the statement timeout would have ended it the same way
    assert _read_result(raw) == "57014"
    assert time.monotonic() - started < STATEMENT_TIMEOUT / 2
    assert _stopped_at(raw_connection, scheduler.replica_id) is None  # nothing sent meanwhile

    scheduler.close()  # beat's exit, once unwound: the session is idle
    assert connection.connection is raw
    assert _stopped_at(raw_connection, scheduler.replica_id) is not None


def test_close_inside_a_transaction_leaves_the_stop_to_the_next_close(
    raw_connection, django_assert_num_queries
):
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()
    with pytest.raises(SystemExit), transaction.atomic():
        with django_assert_num_queries(0):  # a write here would be rolled back with the rest
            scheduler.close()
        raise SystemExit  # what Celery's handler raises next
    assert _stopped_at(raw_connection, scheduler.replica_id) is None
    scheduler.close()
    assert Replica.objects.get(pk=scheduler.replica_id).stopped_at is not None


@patch.multiple(cadences, STATEMENT_TIMEOUT=STATEMENT_TIMEOUT)
def test_a_statement_left_in_flight_ends_with_its_session_and_its_locks(raw_connection):
    connection.close()
    ledger.configure_session()
    raw = connection.connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [RECONCILE_LOCK])  # the reconcile turn
    old = _send(raw, "SELECT pg_sleep(60)", raw_connection)  # lock free: the call has unwound

    assert ledger.ready_for_stop() is True
    assert raw.closed
    assert connection.connection is not raw
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid(), current_setting('application_name')")
        pid, name = cursor.fetchone()
    assert pid != old and name == ledger.application_name(conf.replica_id)  # bounds set again

    def turn_free() -> bool:
        taken = raw_connection.execute(
            "SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK]
        ).fetchone()[0]
        raw_connection.commit()
        return taken

    wait_until(turn_free, timeout=STATEMENT_TIMEOUT / 2)
    active = raw_connection.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [old]
    ).fetchone()[0]
    assert active == 0


def test_an_idle_session_is_fit_for_the_stop_and_a_transaction_is_not():
    ledger.configure_session()
    raw = connection.connection
    assert ledger.ready_for_stop() is True
    with transaction.atomic():
        assert ledger.ready_for_stop() is False
    assert ledger.ready_for_stop() is True
    assert connection.connection is raw


def test_inside_a_psycopg_call_between_statements_nothing_is_sent():
    """The lock is held a moment before a statement is sent and after its result is read."""
    ledger.configure_session()
    raw = connection.connection
    with raw.lock:
        assert raw.info.transaction_status == pq.TransactionStatus.IDLE
        assert ledger.ready_for_stop() is False  # a statement would wait on the lock for ever
    assert ledger.ready_for_stop() is True
