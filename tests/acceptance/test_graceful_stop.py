"""Issue 14, acceptance 6: a graceful stop at any instant.

A beat replica gets SIGTERM (or SIGINT) while its poll or a statement of its reconcile pass waits
on a table lock another session holds, between publishing and committing a claim, or in its idle
sleep. Each time it exits within the statement timeout (``cadences.STATEMENT_TIMEOUT``; a claim
first commits, its message being out), its ``Replica`` row records the clean stop
(``stopped_at``) and the reconcile turn is free for another replica at once, not after
``TURN_PATIENCE``.

The lock is held until the replica has exited (or the bound has passed), longer than the stop may
take: the replica must not wait for the statement to finish. That a statement is in flight is
read from ``pg_stat_activity``: the replica's session (``application_name``
``scheduling-beat:<replica id>``) waiting on a lock.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg
import pytest
from django.db import connection

from scheduling import cadences, ledger
from scheduling.models import Replica, Run, ScheduleChange
from scheduling.schedulers import TURN_PATIENCE
from scheduling.sql import RECONCILE_LOCK, queries
from tests.acceptance.deployment import Deployment, broker_task_ids, wait_until

# The database session's state at the signal is the point; the broker in use is incidental.
pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]

REPLICA = "stopping"
#: Seconds a replica may take past its stop's own bound to record the stop (``stopped_at``):
#: 0.1 s when the machine is quiet, up to 2 s on 2 busy cores.
EXIT_MARGIN = 3.0
#: Seconds the process may take past that to exit: the interpreter's teardown, which is the
#: machine's speed, not the stop's (0.3 s quiet; seen past 6 s at load 20). Docker's default
#: grace period before it sends SIGKILL is 10 s.
TEARDOWN = 10.0
#: Seconds the pausing replica stays in its claim transaction after publishing.
PAUSE = 3.0
assert EXIT_MARGIN < TURN_PATIENCE  # a turn freed within the margin was not taken by patience


def _started(tmp_path, *, pause_after_publish: float = 0.0, **env: str) -> Deployment:
    """Start the replica; return once its start-up pass is done and it has registered."""
    deployment = Deployment(tmp_path, **env)
    deployment.start_beat(REPLICA, pause_after_publish=pause_after_publish)
    deployment.wait_for_log(REPLICA, "full reconcile: planned", timeout=60)
    wait_until(
        lambda: Replica.objects.filter(pk=REPLICA, stopped_at__isnull=True).exists(), timeout=30
    )
    return deployment


def _blocked_statement() -> tuple[str, datetime, bool] | None:
    """The replica's statement waiting on a lock: (its text, its start, the session holds an
    advisory lock, i.e. the reconcile turn); None while it waits on none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.query, a.query_start, EXISTS (SELECT 1 FROM pg_locks l"
            "  WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted)"
            " FROM pg_stat_activity a"
            " WHERE a.datname = current_database() AND a.application_name = %s"
            " AND a.wait_event_type = 'Lock'",
            [ledger.application_name(REPLICA)],
        )
        return cursor.fetchone()


def _idle() -> bool:
    """Whether the replica's session is idle: no statement, no transaction (it is sleeping)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state = 'idle' FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [ledger.application_name(REPLICA)],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def _hold(raw: psycopg.Connection, table: str) -> None:
    """Lock ``table`` in ACCESS EXCLUSIVE mode on ``raw``: every read of it waits until rollback."""
    raw.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')


def _stop(
    deployment: Deployment,
    sig: signal.Signals,
    bound: float,
    raw: psycopg.Connection,
    in_flight: Callable[[datetime], None] = lambda signalled_at: None,
) -> None:
    """Send ``sig`` to the replica and assert that it records its stop within ``bound`` seconds
    and exits within ``TEARDOWN`` more.

    Then releases what ``raw`` holds, and asserts that the reconcile turn is free at once.
    ``in_flight(signalled_at)`` checks, with the database clock at the signal, what was in
    flight then.
    """
    process = deployment.processes[REPLICA]
    signalled_at = ledger.database_now()
    signalled = time.monotonic()
    deployment.send(REPLICA, sig)
    in_flight(signalled_at)
    try:
        process.wait(timeout=bound + TEARDOWN)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"replica still running {bound + TEARDOWN:.1f} s after {sig.name}:\n"
            f"{deployment.tail(REPLICA)}"
        ) from None
    exited = time.monotonic() - signalled
    raw.rollback()  # the table lock, held until now
    print(f"{sig.name}: exited {exited:.2f} s after the signal (bound {bound:.1f} s)")
    assert process.returncode == 0, deployment.tail(REPLICA)

    replica = Replica.objects.get(pk=REPLICA)
    assert replica.stopped_at is not None, deployment.tail(REPLICA)
    recorded = (replica.stopped_at - signalled_at).total_seconds()
    print(f"stop recorded {recorded:.2f} s after the signal (database clock)")
    assert 0 <= recorded <= bound

    def turn_taken() -> bool:
        taken = raw.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK]).fetchone()[0]
        raw.commit()
        return taken

    freed = time.monotonic()
    wait_until(turn_taken, timeout=EXIT_MARGIN)
    print(f"reconcile turn taken {time.monotonic() - freed:.2f} s after the exit")
    raw.execute("SELECT pg_advisory_unlock(%s)", [RECONCILE_LOCK])
    raw.commit()


def _shut(deployment: Deployment, raw: psycopg.Connection) -> None:
    raw.rollback()
    if REPLICA in deployment.processes and deployment.alive(REPLICA):
        deployment.kill(REPLICA)  # still hanging after a failed assertion
    deployment.stop()


def _still_running_at(signalled_at: datetime, started: datetime) -> None:
    """The blocked statement had not reached the statement timeout when it was signalled."""
    assert signalled_at - started < timedelta(seconds=cadences.STATEMENT_TIMEOUT)


def test_sigterm_while_the_poll_waits_on_a_lock(tmp_path, raw_connection):
    deployment = _started(tmp_path)
    try:
        _hold(raw_connection, Run._meta.db_table)
        query, started, _ = wait_until(_blocked_statement, timeout=cadences.STATEMENT_TIMEOUT * 3)
        # the poll as sent: its due floor bound on the client (a quoted timestamp)
        poll = re.escape(queries["poll"].strip()).replace("%s", "'[^']+'(::timestamptz)?")
        assert re.fullmatch(poll, query.strip()), query
        _stop(
            deployment, signal.SIGTERM, cadences.STATEMENT_TIMEOUT + EXIT_MARGIN, raw_connection,
            lambda signalled_at: _still_running_at(signalled_at, started),
        )
    finally:
        _shut(deployment, raw_connection)


def test_sigterm_while_a_reconcile_pass_holds_the_turn_and_waits_on_a_lock(
    tmp_path, raw_connection
):
    """A pass every 0.5 s; the change log it reads first is locked, so the pass waits holding
    the reconcile turn (a session-level advisory lock)."""
    deployment = _started(tmp_path, SCHEDULING_RECONCILE_INTERVAL="0.5")
    try:
        _hold(raw_connection, ScheduleChange._meta.db_table)
        query, started, holds_turn = wait_until(
            _blocked_statement, timeout=cadences.STATEMENT_TIMEOUT * 3
        )
        assert ScheduleChange._meta.db_table in query
        assert holds_turn
        _stop(
            deployment, signal.SIGTERM, cadences.STATEMENT_TIMEOUT + EXIT_MARGIN, raw_connection,
            lambda signalled_at: _still_running_at(signalled_at, started),
        )
    finally:
        _shut(deployment, raw_connection)


def test_sigterm_between_publish_and_commit_commits_the_claim_then_exits(
    tmp_path, raw_connection, make_task
):
    deployment = _started(tmp_path, pause_after_publish=PAUSE)
    try:
        task = make_task(clocked=ledger.database_now() + timedelta(seconds=1), name="graceful")
        deployment.wait_for_log(REPLICA, "test pause: published", timeout=30)
        _stop(deployment, signal.SIGTERM, PAUSE + EXIT_MARGIN, raw_connection)
        queued = broker_task_ids(deployment.queue)  # before _shut deletes the queue
    finally:
        _shut(deployment, raw_connection)
    run = Run.objects.get(periodic_task=task)
    assert (run.status, run.claimed_by) == (Run.Status.DISPATCHED, REPLICA)
    assert queued == [run.task_id]


def test_sigint_in_the_idle_sleep(tmp_path, raw_connection):
    deployment = _started(tmp_path)
    try:
        wait_until(_idle, timeout=10)
        _stop(deployment, signal.SIGINT, EXIT_MARGIN, raw_connection)
    finally:
        _shut(deployment, raw_connection)
