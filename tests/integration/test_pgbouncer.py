"""Through a real PgBouncer in transaction mode: what works through it, and what needs a direct one.

Each test starts a PgBouncer of its own (``tests.pgbouncer``) in front of the test database's
server and routes Django's ``default`` connection through it; ``direct`` is an alias of the same
test database without it, named by ``SCHEDULING_DIRECT_DATABASE`` as a deployment behind
PgBouncer would. Planning, the claim, prune and the guard's decision go through the pooler; the
reconcile turn and the guard's execution locks stay on the direct connection.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace

import psycopg
import pytest
from celery.exceptions import Ignore
from django.db import DatabaseError, connection, connections, transaction
from django.db.backends.postgresql.base import DatabaseWrapper

from scheduling import cadences, checks, guard, ledger
from scheduling.models import Run
from scheduling.sql import RECONCILE_LOCK
from tests.integration.conftest import GRACE, claim, make_due

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def routed(bouncer, settings, *, direct: bool = True) -> Iterator[None]:
    """``default`` through ``bouncer``; with ``direct``, alias ``direct`` without it, in use."""
    original = copy.deepcopy(connection.settings_dict)
    wrappers = list(connection.execute_wrappers)
    connection.close()
    guard.liveness.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=bouncer.port)
    if direct:  # made here, not in DATABASES: Django's test case lets a test use it
        connections["direct"] = DatabaseWrapper(copy.deepcopy(original), "direct")
        settings.SCHEDULING_DIRECT_DATABASE = "direct"
    try:
        yield
    finally:
        guard.liveness.close()
        connection.close()
        connection.execute_wrappers[:] = wrappers  # the pooled session's bounds wrapper goes
        connection.settings_dict.clear()
        connection.settings_dict.update(original)
        if direct:
            connections["direct"].close()
            del connections["direct"]


@pytest.fixture
def through_pgbouncer(pgbouncer, settings) -> Iterator[object]:
    """``default`` through a PgBouncer, ``direct`` (SCHEDULING_DIRECT_DATABASE) without."""
    with routed(pgbouncer, settings):
        yield pgbouncer


@pytest.fixture
def only_pgbouncer(pgbouncer, settings) -> Iterator[object]:
    """``default`` through a PgBouncer and nothing else: the locks' connection is pooled."""
    with routed(pgbouncer, settings, direct=False):
        yield pgbouncer


def _direct_client() -> psycopg.Connection:
    params = connections["direct"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def _client(bouncer) -> psycopg.Connection:
    name = connection.settings_dict["NAME"]
    return psycopg.connect(bouncer.url(name), autocommit=True)


def _server_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_the_pooler_is_told_from_the_direct_connection(through_pgbouncer):
    assert ledger.pooled("default") is True
    assert ledger.pooled("direct") is False
    # On the direct connection the id given at login is the server's.
    assert connections["direct"].connection.info.backend_pid == _direct_pid()


def _direct_pid() -> int:
    with connections["direct"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_prepared_claims_follow_what_the_pooler_keeps(through_pgbouncer):
    """PgBouncer before 1.21 passes a prepared statement to one server session only: no."""
    assert ledger.keeps_prepared("default") is through_pgbouncer.keeps_prepared
    assert ledger.keeps_prepared("direct") is True
    with connections["direct"].cursor() as cursor:  # the probe left nothing prepared behind
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'scheduling%'")
        assert cursor.fetchone()[0] == 0


def test_claims_succeed_on_whichever_server_session_the_pooler_lends(
    start_pgbouncer, settings, make_task, recorder
):
    """Two server sessions; the second claim is forced onto the one the first did not use.

    A claim prepared on the first (psycopg's ``_pg3_0``) and only executed on the second would
    fail there ("prepared statement does not exist") behind a PgBouncer that does not keep them.
    """
    bouncer = start_pgbouncer(pool_size=2)
    tasks = [make_task(every=3600) for _ in range(2)]
    with routed(bouncer, settings):
        ledger.configure_session()
        make_due(tasks[0])
        with transaction.atomic():
            first_server = _server_pid()
            assert [d.task_id for d in claim(recorder)] == recorder.task_ids
        held = _hold_server(bouncer, first_server)
        try:
            make_due(tasks[1])
            with transaction.atomic():
                assert _server_pid() != first_server
                second = claim(recorder)
        finally:
            held.close()
    assert len(second) == 1 and len(recorder.task_ids) == 2
    assert Run.objects.filter(status=Run.Status.DISPATCHED).count() == 2


def _hold_server(bouncer, pid: int) -> psycopg.Connection:
    """A client of ``bouncer`` inside a transaction on the server session ``pid`` (pool of 2)."""
    clients = []
    for _ in range(2):
        client = psycopg.connect(bouncer.url(connection.settings_dict["NAME"]))
        clients.append(client)
        if client.execute("SELECT pg_backend_pid()").fetchone()[0] == pid:
            for other in clients[:-1]:
                other.close()
            return client
    raise AssertionError("no client was lent that server session")


def test_the_bounds_are_set_per_transaction_and_reach_no_other_client(
    monkeypatch, start_pgbouncer, settings
):
    """One server session for every client (a pool of 1): a session setting would stay there."""
    bouncer = start_pgbouncer(pool_size=1)
    settings.SCHEDULING_REPLICA_ID = "replica-7"
    monkeypatch.setattr(cadences, "IDLE_IN_TRANSACTION_TIMEOUT", 3.5)
    monkeypatch.setattr(cadences, "STATEMENT_TIMEOUT", 2.0)
    names = ("idle_in_transaction_session_timeout", "statement_timeout", "application_name")
    read = "SELECT " + ", ".join(f"current_setting('{name}')" for name in names)
    with routed(bouncer, settings):
        with _direct_client() as plain:
            defaults = plain.execute(read).fetchone()
        ledger.configure_session()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(read)
            inside = cursor.fetchone()
        with _client(bouncer) as other:
            after = other.execute(read).fetchone()
    assert inside == ("3500ms", "2s", "scheduling-beat:replica-7")
    assert after[:2] == defaults[:2]
    assert after[2] != "scheduling-beat:replica-7"


def test_the_server_ends_a_transaction_left_idle_through_the_pooler(
    monkeypatch, through_pgbouncer, settings
):
    """Invariant 8 through PgBouncer: the bound set in the transaction is the server's."""
    monkeypatch.setattr(cadences, "IDLE_IN_TRANSACTION_TIMEOUT", 1.0)
    ledger.configure_session()
    started = time.monotonic()
    with pytest.raises(DatabaseError, match="idle-in-transaction timeout"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            time.sleep(2.5)
            cursor.execute("SELECT 1")
    assert time.monotonic() - started < 10
    ledger.close_sessions()
    ledger.configure_session()  # a new client connection, bounded again
    assert ledger.poll().now is not None


def test_the_reconcile_turn_is_held_on_the_direct_connection(through_pgbouncer):
    ledger.configure_session()
    held = (
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND ((classid::bigint << 32) | objid::bigint) = %s"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    with _direct_client() as observer:
        with ledger.reconcile_turn() as mine:
            assert mine is True
            holders = [row[0] for row in observer.execute(held, [RECONCILE_LOCK])]
            assert holders == [_direct_pid()]
            assert observer.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK]).fetchone()[
                0
            ] is False
        assert observer.execute(held, [RECONCILE_LOCK]).fetchall() == []


def test_planning_claim_guard_and_prune_work_through_the_pooler(through_pgbouncer, make_task,
                                                                recorder):
    task = make_task(every=3600)
    ledger.configure_session()
    assert ledger.reconcile(GRACE, full=True) == 1  # planned through the pooler
    run = make_due(task)
    assert [d.task_id for d in claim(recorder)] == [run.task_id]

    request = SimpleNamespace(get={"retries": 0, "hostname": "w1@host"}.get)
    guard.guard(request, run.task_id)  # executes: its lock on the direct connection
    assert guard.liveness.backend_pid() == _liveness_server_pid()
    with pytest.raises(Ignore):  # a re-published copy while it runs
        guard.guard(request, run.task_id)
    run.refresh_from_db()
    assert (run.status, run.executions, run.suppressed) == (Run.Status.RUNNING, 1, 1)
    ledger.record_finished(run.task_id, Run.Status.SUCCEEDED, retries=0)
    guard.liveness.unlock(guard.Attempt(run.task_id, 0))

    Run.objects.filter(pk=run.pk).update(finished_at=ledger.database_now() - timedelta(days=2))
    plan = ledger.prune_plan(timedelta(days=1))
    assert ledger.prune(plan, batch_size=10) == {Run.Status.SUCCEEDED: 1}
    assert not Run.objects.filter(pk=run.pk).exists()


def _liveness_server_pid() -> int:
    """The server process id of the guard's session, seen from the server's side."""
    with _direct_client() as observer:
        row = observer.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'scheduling-guard'"
            " AND datname = current_database()"
        ).fetchone()
    return row[0]


def test_locks_on_a_pooled_connection_are_reported(only_pgbouncer, caplog):
    with caplog.at_level(logging.INFO, logger="scheduling"):
        ledger.configure_session()
        guard.liveness.try_lock(guard.Attempt("reported", 0))
    reported = [r for r in caplog.records if getattr(r, "action", "") == "pooled_locks"]
    assert [(r.levelno, r.getMessage().split(" on database alias ")[0]) for r in reported] == [
        (logging.ERROR, "session-level advisory locks (a replica's reconcile turn)"),
        (logging.ERROR, "session-level advisory locks (the worker guard's execution locks)"),
    ]
    assert "SCHEDULING_DIRECT_DATABASE" in reported[0].getMessage()
    guard.liveness.unlock(guard.Attempt("reported", 0))


def test_a_silenced_check_turns_the_report_into_information(only_pgbouncer, settings, caplog):
    settings.SILENCED_SYSTEM_CHECKS = ["scheduling.E003"]
    with caplog.at_level(logging.INFO, logger="scheduling"):
        ledger.configure_session()
    reported = [r for r in caplog.records if getattr(r, "action", "") == "pooled_locks"]
    assert [r.levelno for r in reported] == [logging.INFO]


def test_the_check_fires_when_the_locks_connection_is_pooled(only_pgbouncer):
    errors = checks.check_direct_connection(databases=["default"])
    assert [e.id for e in errors] == ["scheduling.E003"]
    assert "SCHEDULING_DIRECT_DATABASE" in errors[0].hint
    assert checks.check_direct_connection(databases=None) == []  # a database check only


def test_the_check_passes_with_a_direct_connection(through_pgbouncer):
    assert checks.check_direct_database() == []
    assert checks.check_direct_connection(databases=["default"]) == []


def test_the_check_fires_when_the_direct_connection_reaches_another_database(
    through_pgbouncer
):
    connections["direct"].close()
    connections["direct"].settings_dict["NAME"] = "postgres"
    errors = checks.check_direct_connection(databases=["default"])
    assert [e.id for e in errors] == ["scheduling.E005"]


def test_the_check_fires_when_the_setting_names_no_alias(settings):
    settings.SCHEDULING_DIRECT_DATABASE = "nowhere"
    errors = checks.check_direct_database()
    assert [e.id for e in errors] == ["scheduling.E004"]
    assert "'nowhere'" in errors[0].msg
    assert checks.check_direct_connection(databases=["default"]) == []  # E004 says it all


def test_a_direct_default_connection_passes_the_check():
    assert ledger.pooled("default") is False
    assert checks.check_direct_connection(databases=["default"]) == []
