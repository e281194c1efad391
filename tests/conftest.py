"""Shared fixtures: factories for periodic tasks and schedules, a second database session."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
)

from tests.needs import missing

_names = itertools.count()


def connect_raw() -> psycopg.Connection:
    """A new connection to Django's database, outside Django, in manual-commit mode."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params)


@pytest.fixture
def raw_connection(transactional_db) -> Iterator[psycopg.Connection]:
    """A second connection to the test database, outside Django, in manual-commit mode."""
    conn = connect_raw()
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def make_task():
    """Create and return a saved PeriodicTask; pass one of interval=, crontab=, clocked=."""

    def make(
        *,
        every: float | None = None,
        period: str = IntervalSchedule.SECONDS,
        cron: str | None = None,
        timezone: str = "UTC",
        clocked: datetime | ClockedSchedule | None = None,
        name: str | None = None,
        task: str = "project.tasks.record",
        **fields: Any,
    ) -> PeriodicTask:
        if every is not None:
            fields["interval"], _ = IntervalSchedule.objects.get_or_create(
                every=every, period=period
            )
        if cron is not None:
            minute, hour, day_of_month, month_of_year, day_of_week = cron.split()
            fields["crontab"], _ = CrontabSchedule.objects.get_or_create(
                minute=minute,
                hour=hour,
                day_of_month=day_of_month,
                month_of_year=month_of_year,
                day_of_week=day_of_week,
                timezone=timezone,
            )
        if clocked is not None:
            if not isinstance(clocked, ClockedSchedule):
                clocked = ClockedSchedule.objects.create(clocked_time=clocked)
            fields["clocked"] = clocked
            fields.setdefault("one_off", True)
        return PeriodicTask.objects.create(
            name=name or f"task-{next(_names)}", task=task, **fields
        )

    return make


def utc(*args: int) -> datetime:
    """Return an aware UTC datetime: utc(2025, 3, 9, 20, 4)."""
    from datetime import UTC

    return datetime(*args, tzinfo=UTC)


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def kombu_batches_publishes() -> bool:
    """Whether this kombu has ``Producer.batch`` (5.7 and later): on Redis, a claim's messages go
    in pipelines sent at each flush; with older kombu each one is sent when it is published."""
    from kombu import Producer

    return hasattr(Producer, "batch")


#: Test files handed to a pytest-xdist worker before all others (.ci/run hands files out in
#: collection order): the quick benchmark takes ten minutes, and started late it ends the pass.
FIRST_FILES = ("test_bench.py",)


def pytest_collection_modifyitems(items):
    """Mark every test under tests/unit `once` (pure logic, the same on any database or broker),
    and move the tests of FIRST_FILES to the front, keeping the order of the others."""
    for item in items:
        if "/tests/unit/" in str(item.path):
            item.add_marker(pytest.mark.once)
    items.sort(key=lambda item: item.path.name not in FIRST_FILES)


@pytest.fixture
def pgbouncer_upstream() -> tuple[str, int]:
    """(host or socket folder, port) of the PostgreSQL server the test database is on."""
    params = connection.get_connection_params()
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)


@pytest.fixture
def start_pgbouncer(pgbouncer_upstream) -> Iterator[Any]:
    """Start PgBouncers of this test's own (``start_pgbouncer(pool_size=1)``), stopped at its end.

    In transaction mode, in front of the test database's server (``tests.pgbouncer``). Skipped
    when the pgbouncer binary is missing (Debian's package: apt-get install -y pgbouncer), except
    with the CI variable set, where that fails the test.
    """
    from tests.pgbouncer import PgBouncer, binary

    if binary() is None:
        missing("pgbouncer is missing: install Debian's pgbouncer (apt-get install -y pgbouncer)")
    started: list[PgBouncer] = []

    def start(**options: Any) -> PgBouncer:
        started.append(PgBouncer(pgbouncer_upstream, **options))
        return started[-1]

    try:
        yield start
    finally:
        for bouncer in started:
            bouncer.stop()


@pytest.fixture
def pgbouncer(start_pgbouncer) -> Any:
    """A PgBouncer of this test's own in transaction mode (``start_pgbouncer()``)."""
    return start_pgbouncer()
