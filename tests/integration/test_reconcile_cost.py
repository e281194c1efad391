"""Reconcile passes cost what changed, not the number of tasks (issue 6, docs/benchmarks.md).

A replica checks every task at its start (and every cadences.FULL_RECONCILE_INTERVAL); its
other passes read the change log: created tasks ('unplanned', by the insert trigger), edits, and
tasks whose schedule gave no next slot at claim time.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from unittest.mock import patch

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from project.celery import app
from scheduling import cadences, ledger
from scheduling.models import Run, ScheduleChange
from scheduling.schedulers import LedgerScheduler
from scheduling.sql import RECONCILE_LOCK, queries
from tests.integration.conftest import GRACE, claim

pytestmark = pytest.mark.django_db(transaction=True)


def _statements(captured: CaptureQueriesContext) -> list[str]:
    """The statements run, without transaction control (BEGIN, COMMIT, savepoints).

    The prepared claim has no text in Django's query log (psycopg keeps none): it is left out.
    """
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
    queries = [q["sql"] for q in captured.captured_queries if q["sql"] is not None]
    return [sql for sql in queries if not sql.startswith(control)]


def _wait_for_session_end(pid: int, timeout: float = 30.0) -> None:
    """Wait until the server has ended backend ``pid`` and so released its advisory locks.

    Closing the client's socket returns before the server's backend has exited: on a loaded
    machine the next tick could still find the turn taken (seen at load 4).
    """
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone()[0] == 0:
                return
            assert time.monotonic() < deadline, f"backend {pid} still there after {timeout} s"
            time.sleep(0.02)


@pytest.mark.parametrize("tasks", [3, 60])
def test_a_pass_with_nothing_changed_runs_three_queries_and_reads_no_task(make_task, tasks):
    for _ in range(tasks):
        make_task(every=3600)
    ledger.reconcile(GRACE)
    ScheduleChange.objects.all().delete()
    with CaptureQueriesContext(connection) as captured:
        assert ledger.reconcile(GRACE, full=False) == 0
    statements = _statements(captured)
    # The log pruned (with the transaction horizon) and read; one batch of orphans (of deleted
    # tasks: none), cancelled as found.
    assert [s.split()[0] for s in statements] == ["WITH", "SELECT", "WITH"]
    assert not any("django_celery_beat_periodictask" in s for s in statements)


def test_a_pass_after_another_replicas_pass_for_the_same_edit_builds_no_planning_query(make_task):
    """Each replica passes for each edit; after the first (which re-planned it) the others find
    the runs planned from the current definition version: a few statements, none reading the
    tasks' schedule rows (where the Django queries that re-plan and plan cost milliseconds of
    CPU each, a replica's share of an edit storm)."""
    tasks = [make_task(cron="0 3 * * *") for _ in range(3)]
    ledger.reconcile(GRACE)
    ScheduleChange.objects.all().delete()
    crontab = tasks[0].crontab
    crontab.hour = "5"
    crontab.save()
    assert ledger.reconcile(GRACE, full=False) == 0  # re-plans the three (cancel + insert)
    assert {r.scheduled_for.hour for r in Run.objects.pending()} == {5}
    with CaptureQueriesContext(connection) as captured:  # another replica's pass, same change
        assert ledger.reconcile(GRACE, full=False, settled=ledger.SettledChanges()) == 0
    statements = _statements(captured)
    # The log pruned (with the transaction horizon) and read, orphans (one batch, cancelled as
    # found), plans from an older version, unplanned.
    assert [s.split()[0] for s in statements] == ["WITH", "SELECT", "WITH", "SELECT", "SELECT"]
    assert not any("django_celery_beat_crontabschedule" in s for s in statements)
    assert {r.scheduled_for.hour for r in Run.objects.pending()} == {5}


def test_a_created_task_is_logged_unplanned_and_planned_by_the_next_pass(make_task):
    task = make_task(every=3600)
    assert list(ScheduleChange.objects.values_list("kind", "object_id")) == [
        (ScheduleChange.Kind.UNPLANNED, task.pk)
    ]
    assert ledger.reconcile(GRACE, full=False) == 1
    assert Run.objects.pending().filter(periodic_task=task).count() == 1
    assert ledger.reconcile(GRACE, full=False) == 0  # logged still, and planned already


def test_a_schedule_that_fails_at_claim_time_is_logged_and_its_error_recorded(make_task, recorder):
    # The next slot after the first is 8,000 years away: past datetime's range.
    task = make_task(every=3_000_000, period=IntervalSchedule.DAYS,
                     start_time=ledger.database_now() - timedelta(seconds=1))
    ledger.reconcile(GRACE)
    ScheduleChange.objects.all().delete()
    assert [d.status for d in claim(recorder)] == [Run.Status.DISPATCHED]
    assert list(ScheduleChange.objects.values_list("kind", "object_id")) == [
        (ScheduleChange.Kind.UNPLANNED, task.pk)
    ]
    assert ledger.reconcile(GRACE, full=False) == 1
    failed = Run.objects.get(periodic_task=task, status=Run.Status.FAILED)
    assert (failed.reason, failed.error) == (
        "invalid schedule", f"the next slot of {task.name!r} is out of range"
    )


def test_the_scheduler_checks_every_task_only_at_start_and_every_full_interval(make_task, caplog):
    make_task(every=3600)
    scheduler = LedgerScheduler(app=app)
    logging.getLogger("scheduling.schedulers").addHandler(caplog.handler)  # it does not propagate
    with caplog.at_level(logging.INFO, logger="scheduling.schedulers"):
        scheduler.tick()
        created = make_task(every=3600)  # moves the change marker: a pass on the next tick
        scheduler.tick()
        full = [r for r in caplog.records if r.getMessage().startswith("full reconcile")]
        assert [r.getMessage().split(" in ")[0] for r in full] == ["full reconcile: planned 1 runs"]
        assert Run.objects.pending().filter(periodic_task=created).count() == 1
        with patch.multiple(cadences, FULL_RECONCILE_INTERVAL=0):
            make_task(every=3600)
            scheduler.tick()
    logging.getLogger("scheduling.schedulers").removeHandler(caplog.handler)
    full = [r for r in caplog.records if r.getMessage().startswith("full reconcile")]
    assert len(full) == 2


def test_the_claim_and_the_poll_read_the_pending_index_in_due_order(make_task):
    for _ in range(5):
        make_task(every=3600)
    ledger.reconcile(GRACE)
    with connection.cursor() as cursor:
        # A tiny table, whose statistics (left by earlier tests) may make a bitmap scan and a
        # sort look as cheap: show the plan a big one gets, where LIMIT 100 reads the index.
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_bitmapscan = off")
        cursor.execute(
            "EXPLAIN SELECT id FROM scheduling_run WHERE status = 'pending'"
            " AND due_at <= statement_timestamp() ORDER BY due_at, id LIMIT 100"
        )
        claim_plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
        cursor.execute("RESET enable_bitmapscan")
    assert "Scan using scheduling_run_pending_due" in claim_plan
    assert "Index Cond: (due_at <= statement_timestamp())" in claim_plan
    assert "Sort" not in claim_plan  # the index is in the claim's order (due_at, id)


def test_the_redelivery_reads_only_runs_published_before_the_shortest_deadline(make_task):
    """Each pass looks for overdue dispatched runs; a backlog of dispatched runs (workers down)
    is not read whole: the index of dispatched runs by last publish is scanned from the oldest
    up to the shortest delivery deadline in force (a policy's, or the setting)."""
    make_task(every=3600)
    ledger.reconcile(GRACE)
    with connection.cursor() as cursor:
        # this test's own statistics (rolled back with it), not those other tests' rows left
        cursor.execute("ANALYZE scheduling_run")
        cursor.execute("SET enable_seqscan = off")  # a tiny table: show a big one's plan
        cursor.execute("SET enable_bitmapscan = off")
        cursor.execute(
            "EXPLAIN " + queries["overdue_deliveries"], {"timeout": 3600.0, "limit": 100}
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
        cursor.execute("RESET enable_bitmapscan")
    assert "Index Scan using scheduling_run_published" in plan
    assert "Index Cond: (COALESCE(republished_at, dispatched_at) < (statement_timestamp()" in plan
    assert "Sort" not in plan  # oldest first is the index's order


@pytest.mark.parametrize("name", ["stale_plans", "unplanned_tasks"])
def test_the_pre_checks_probe_the_tasks_named_by_id_whatever_their_number(make_task, name):
    """A pass's pre-checks look up the tasks the change log names by id one by one, by primary
    key: for a few thousand ids (a bulk disable) the planner's costs chose a parallel scan of
    every periodic task, 140-160 ms at a million (issue 17's bench). Here every task is named,
    the case where a scan looks cheapest; the answer still comes from the probes."""
    tasks = [make_task(every=3600) for _ in range(40)]
    ledger.reconcile(GRACE)
    ids = sorted(task.pk for task in tasks)
    params = {"task": ids, "interval": [], "crontab": [], "solar": [], "clocked": []}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_celery_beat_periodictask")
        cursor.execute("EXPLAIN (FORMAT JSON) " + queries[name], params)
        plan = cursor.fetchone()[0]
        cursor.execute(queries[name], params)
        answer = cursor.fetchone()[0]

    def scans(node: dict) -> list[tuple[str, str]]:
        """(node type, condition) of each scan of the periodic tasks."""
        own = [(node["Node Type"], node.get("Index Cond", node.get("Filter", "")))] if node.get(
            "Relation Name") == "django_celery_beat_periodictask" else []
        return own + [scan for child in node.get("Plans", []) for scan in scans(child)]

    plan = plan if isinstance(plan, list) else json.loads(plan)
    (_, by_id), _by_schedule = scans(plan[0]["Plan"])  # the schedule kinds' ids: none here
    # Once per id named (an index probe on a big table; this one fits a page, which the planner
    # may read instead), never one pass over the whole table joined to the ids.
    assert "(id = named.id)" in by_id
    assert answer is False  # every task has its pending run, planned from its definition
    Run.objects.filter(periodic_task_id=ids[-1]).delete()
    PeriodicTask.objects.filter(pk=ids[0]).update(description="a new version: 2")
    with connection.cursor() as cursor:
        if name == "stale_plans":  # the run of ids[0] is from version 1, the task at 2
            cursor.execute(queries[name], {**params, "task": [ids[0]]})
        else:  # ids[-1] has no pending run
            cursor.execute(queries[name], {**params, "task": [ids[-1]]})
        assert cursor.fetchone()[0] is True


def test_one_replica_reconciles_at_a_time_and_the_others_go_on_dispatching(
    make_task, raw_connection
):
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # its startup pass
    start = ledger.database_now() - timedelta(seconds=0.5)
    due = make_task(every=3600, start_time=start)
    # another replica is reconciling: it holds the turn (its session's advisory lock)
    raw_connection.execute("SELECT pg_advisory_lock(%s)", [RECONCILE_LOCK])
    with ledger.reconcile_turn() as mine:
        assert mine is False
    ledger.reconcile(GRACE, full=False)  # what that replica's pass does: plans the new task
    with CaptureQueriesContext(connection) as captured:
        scheduler.tick()  # the marker moved: this replica defers its pass and dispatches
    assert not any("scheduling_schedulechange" in s for s in _statements(captured))
    assert scheduler._turn_awaited_since is not None
    assert Run.objects.get(periodic_task=due, scheduled_for=start).status == "dispatched"
    raw_connection.execute("SELECT pg_advisory_unlock(%s)", [RECONCILE_LOCK])

    with ledger.reconcile_turn() as mine:
        assert mine is True
        with raw_connection.cursor() as other:  # held: another session does not get it
            other.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK])
            assert other.fetchone() == (False,)
    with raw_connection.cursor() as other:  # released on exit
        other.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK])
        assert other.fetchone() == (True,)


def test_a_replica_that_skipped_its_turn_passes_again_when_its_interval_is_up(
    make_task, raw_connection, caplog
):
    scheduler = LedgerScheduler(app=app)
    raw_connection.execute("SELECT pg_advisory_lock(%s)", [RECONCILE_LOCK])
    logging.getLogger("scheduling.schedulers").addHandler(caplog.handler)  # it does not propagate
    with caplog.at_level(logging.INFO, logger="scheduling.schedulers"):
        scheduler.tick()  # startup: another replica holds the turn, so no pass here
        assert not any("full reconcile" in m for m in caplog.messages)
        raw_connection.execute("SELECT pg_advisory_unlock(%s)", [RECONCILE_LOCK])
        task = make_task(every=3600)
        with patch.multiple(cadences, RECONCILE_INTERVAL=0):
            scheduler.tick()
    assert [m for m in caplog.messages if "full reconcile" in m] == [
        "full reconcile: planned 1 runs in " + caplog.messages[-1].rsplit(" in ", 1)[1]
    ]
    assert Run.objects.pending().filter(periodic_task=task).count() == 1


def test_a_turn_held_past_the_patience_is_taken_as_stuck_and_the_replica_reconciles_anyway(
    make_task, raw_connection, caplog, monkeypatch
):
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # its startup pass
    # a replica frozen mid-pass (SIGSTOP): its session, and so the turn, lives on
    raw_connection.execute("SELECT pg_advisory_lock(%s)", [RECONCILE_LOCK])
    task = make_task(every=3600)
    monkeypatch.setattr("scheduling.schedulers.TURN_PATIENCE", 0.3)
    logging.getLogger("scheduling.schedulers").addHandler(caplog.handler)  # it does not propagate
    with caplog.at_level(logging.WARNING, logger="scheduling.schedulers"):
        scheduler.tick()  # the turn is taken: it defers its pass for now
        assert Run.objects.pending().filter(periodic_task=task).count() == 0
        started = ledger.database_now()
        while ledger.database_now() - started < timedelta(seconds=0.35):
            scheduler.tick()  # checks the turn each tick, and passes once patience runs out
        assert Run.objects.pending().filter(periodic_task=task).count() == 1
    waited = [m for m in caplog.messages if "reconcile turn" in m]
    assert waited == [
        "another replica has held the reconcile turn for 0 s; reconciling anyway"
    ]
    assert scheduler._turn_awaited_since is None


def test_a_replica_that_deferred_its_pass_makes_it_once_the_turn_is_free(
    make_task, raw_connection
):
    """The holder may have ended mid-pass (killed, or its frozen transaction ended by the
    server) and its pass rolled back: the replica that deferred does not trust it."""
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # its startup pass
    raw_connection.execute("SELECT pg_advisory_lock(%s)", [RECONCILE_LOCK])
    task = make_task(every=3600)
    scheduler.tick()  # the turn is taken: it defers its pass
    assert scheduler._turn_awaited_since is not None
    holder = raw_connection.info.backend_pid
    raw_connection.close()  # the holder's session ends before its pass planned anything
    _wait_for_session_end(holder)
    assert Run.objects.pending().filter(periodic_task=task).count() == 0
    with CaptureQueriesContext(connection) as captured:
        scheduler.tick()  # the turn is free: it makes its own pass
    assert any("scheduling_schedulechange" in s for s in _statements(captured))
    assert Run.objects.pending().filter(periodic_task=task).count() == 1
    assert scheduler._turn_awaited_since is None
    with CaptureQueriesContext(connection) as captured:
        scheduler.tick()  # and it no longer asks
    assert not any("advisory" in s for s in _statements(captured))


def test_a_pass_whose_session_the_server_ended_is_not_counted_as_made(
    make_task, monkeypatch, caplog
):
    """Frozen inside a pass's transaction past the idle-in-transaction timeout, a replica finds
    its session ended (an InternalError, not an OperationalError): the tick fails as a database
    outage and the next tick makes the pass, rather than waiting for the periodic one."""
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # its startup pass
    task = make_task(every=3600)
    marker = scheduler._marker

    def frozen_pass(*args, **kwargs):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '100ms'")
            time.sleep(0.5)  # frozen: the server ends the session meanwhile
            cursor.execute("SELECT 1")

    with monkeypatch.context() as patched:
        patched.setattr(ledger, "reconcile", frozen_pass)
        scheduler.tick()
    assert scheduler._marker is marker  # not counted as made
    assert scheduler._failing == "database"
    assert not any("reconcile failed" in m for m in caplog.messages)
    scheduler.tick()  # reconnects and makes the pass
    assert Run.objects.pending().filter(periodic_task=task).count() == 1
    assert scheduler._marker == ledger.poll().change_marker


def test_a_stop_unwinding_a_pass_on_a_busy_session_keeps_its_system_exit(raw_connection):
    """Seen in a benchmark: SIGTERM mid-pass left the interrupted statement's result unread; the
    turn's release then failed ("another command is already in progress") and replaced beat's
    SystemExit, so the replica went on ticking until SIGKILL. The stop must win; the turn is
    freed with the session."""
    with pytest.raises(SystemExit):
        with ledger.reconcile_turn() as mine:
            assert mine is True
            connection.ensure_connection()
            connection.connection.pgconn.send_query(b"SELECT pg_sleep(0.2)")  # left unread
            raise SystemExit
    with raw_connection.cursor() as other:  # still held: the session lives on
        other.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK])
        assert other.fetchone() == (False,)
    connection.close()  # what the stop does with a busy session (ready_for_stop)
    with raw_connection.cursor() as other:
        deadline = time.monotonic() + 10  # the server frees it once the backend has exited
        while True:
            other.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK])
            if other.fetchone() == (True,) or time.monotonic() > deadline:
                break
            raw_connection.rollback()
            time.sleep(0.05)
        other.execute("SELECT pg_advisory_unlock(%s)", [RECONCILE_LOCK])
        assert other.fetchone() == (True,)
