"""Replica heartbeats: throttled, one statement, outside the claim, never in the way."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from unittest.mock import patch

import pytest
from django.db import connection

from project.celery import app
from scheduling import cadences, ledger
from scheduling.models import Replica, Run
from scheduling.replicas import Heartbeat
from scheduling.schedulers import LedgerScheduler

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def _captured(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records the logger ``name`` handles meanwhile (project loggers do not propagate)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


class Clock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_heartbeat_registers_then_writes_at_most_once_per_interval(django_assert_num_queries):
    clock = Clock()
    heartbeat = Heartbeat("r-1", clock=clock)
    assert heartbeat.beat()
    first = Replica.objects.get(pk="r-1")
    assert (first.host, first.pid, first.runs_claimed, first.stopped_at) == (
        socket.gethostname(), os.getpid(), 0, None
    )
    assert first.started_at == first.last_tick_at

    heartbeat.claimed(3)
    clock.now += 4.9
    with django_assert_num_queries(0):
        assert heartbeat.beat() is False  # inside the 5 s interval: nothing written
    clock.now += 0.1
    heartbeat.claimed(2)
    with django_assert_num_queries(1):
        assert heartbeat.beat()
    second = Replica.objects.get(pk="r-1")
    assert second.runs_claimed == 5
    assert second.started_at == first.started_at and second.last_tick_at > first.last_tick_at

    heartbeat.claimed(1)
    heartbeat.stop()
    stopped = Replica.objects.get(pk="r-1")
    assert stopped.runs_claimed == 6
    assert stopped.stopped_at == stopped.last_tick_at and stopped.stopped_at > second.last_tick_at
    heartbeat.stop()  # beat closes its scheduler twice on SIGTERM: the count is not added again
    assert Replica.objects.get(pk="r-1").runs_claimed == 6


def test_a_restart_under_the_same_id_starts_the_row_afresh():
    old = Heartbeat("replica-1")
    old.claimed(4)
    old.beat()
    old.stop()
    before = Replica.objects.get(pk="replica-1")
    Replica.objects.filter(pk="replica-1").update(pid=1)
    Replica.objects.create(
        id="gone", host="h", pid=2, runs_claimed=1,
        started_at=before.started_at - timedelta(days=9),
        last_tick_at=before.started_at - timedelta(days=8),
    )
    new = Heartbeat("replica-1")
    assert new.beat()
    after = Replica.objects.get(pk="replica-1")
    assert (after.pid, after.runs_claimed, after.stopped_at) == (os.getpid(), 0, None)
    assert after.started_at > before.started_at
    assert not Replica.objects.filter(pk="gone").exists()  # older than a week: pruned


@patch.multiple(cadences, HEARTBEAT_INTERVAL=0)
def test_tick_counts_claimed_runs_and_costs_one_query_more_when_it_beats(
    make_task, django_assert_num_queries
):
    start = ledger.database_now() - timedelta(seconds=0.5)
    make_task(every=3600, start_time=start)
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # plans and claims the due run, then registers with it counted
    replica = Replica.objects.get(pk=scheduler.replica_id)
    assert replica.runs_claimed == 1
    scheduler.tick()
    with django_assert_num_queries(2):  # the poll, and the heartbeat upsert
        assert scheduler.tick() == 0.5
    assert Replica.objects.get(pk=scheduler.replica_id).last_tick_at > replica.last_tick_at
    scheduler.close()
    assert Replica.objects.get(pk=scheduler.replica_id).stopped_at is not None


@patch.multiple(cadences, HEARTBEAT_INTERVAL=0)
def test_a_failing_heartbeat_never_stops_a_claim(make_task, raw_connection):
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # registers the replica row
    raw_connection.execute(
        "SELECT 1 FROM scheduling_replica WHERE id = %s FOR UPDATE", [scheduler.replica_id]
    )  # a transaction holds the row: the next upsert waits for it
    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = '300ms'")
        with _captured("scheduling.replicas") as records:
            delays = [scheduler.tick() for _ in range(3)]
    finally:
        connection.close()  # the next tick configures a fresh session
        raw_connection.rollback()
    assert Run.objects.get(periodic_task=task, scheduled_for=start).status == "dispatched"
    assert all(0 <= d <= 1.0 for d in delays)
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # the first failure of a series is a warning, then debug
    assert warnings[0].action == "heartbeat_failed"  # type: ignore[attr-defined]
    assert "canceling statement due to statement timeout" in warnings[0].getMessage()
    assert Replica.objects.get(pk=scheduler.replica_id).runs_claimed == 0
    assert scheduler.heartbeat.beat()  # the lock is gone: the next beat writes the kept count
    assert Replica.objects.get(pk=scheduler.replica_id).runs_claimed == 1
