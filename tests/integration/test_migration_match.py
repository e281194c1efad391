"""A database a newer release migrated (a rolling deploy: its migrations are unknown to this
code) does not stop this code's replicas and workers; one that lacks this code's migrations
does. Logged once each way."""

from __future__ import annotations

import logging

import pytest
from django.db import connection

from scheduling.migration_match import MigrationWait, migration_gap

pytestmark = pytest.mark.django_db(transaction=True)


def _record(name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES ('scheduling', %s, now())",
            [name],
        )


@pytest.fixture
def newer_release():
    """A migration of a newer release recorded as applied, removed at the end (django_migrations
    is no model's table: the test database's flush would keep it)."""
    _record("0099_a_newer_release")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE name = '0099_a_newer_release'")


def test_a_newer_releases_migrations_alone_do_not_stop_this_code(newer_release, caplog):
    gap = migration_gap()
    assert (gap.missing, gap.unknown, gap.lags) == ((), ("0099_a_newer_release",), False)
    wait = MigrationWait("replica test:1", "claims nothing until they do")
    with caplog.at_level(logging.INFO, logger="scheduling.migration_match"):
        assert (wait.behind(), wait.behind(), wait.waiting) == (False, False, False)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [(
        "WARNING",
        "replica test:1 goes on: the database applied migration(s) 0099_a_newer_release of "
        "scheduling, which this code does not have (a newer release migrated it); run the newer "
        "release, or go back with `python manage.py migrate scheduling <migration>` using it",
    )]


def test_a_missing_migration_of_this_code_stops_it(caplog):
    latest = _latest()
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'scheduling' AND name = %s", [latest]
        )
    try:
        wait = MigrationWait("replica test:1", "claims nothing until they do")
        with caplog.at_level(logging.INFO, logger="scheduling.migration_match"):
            assert (wait.behind(), wait.waiting) == (True, True)
        assert [r.levelname for r in caplog.records] == ["ERROR"]
    finally:
        _record(latest)
    assert wait.behind() is False


def _latest() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(name) FROM django_migrations WHERE app = 'scheduling'"
        )
        return cursor.fetchone()[0]
