"""The scheduler's connections read timestamptz with psycopg's compiled loader, as Django would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import DataError, connection
from django.db.backends.postgresql.psycopg_any import BaseTzLoader

from scheduling import ledger
from scheduling.ledger.timestamps import TIMESTAMPTZ, UtcTimestamptzLoader, use_compiled_timestamps
from scheduling.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

#: Values from either side of the epoch, with microseconds, a leap day and the edges of Python.
TEXTS = [
    "1970-01-01 00:00:00+00", "1969-12-31 23:59:59.999999+00", "2024-02-29 12:34:56.5+00",
    "2026-03-29 01:00:00+01", "2026-10-25 02:30:00-07:30", "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
]


def _read(texts: list[str]) -> list[datetime]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT unnest(%s::text[])::timestamptz", [texts])
        return [row[0] for row in cursor.fetchall()]


def test_configured_session_reads_timestamps_as_django_does_with_the_compiled_loader():
    connection.close()
    django_values = _read(TEXTS)  # a new connection: Django's loader
    with connection.cursor() as cursor:
        loader = cursor.cursor.adapters.get_loader(TIMESTAMPTZ, 0)
    assert issubclass(loader, BaseTzLoader)
    ledger.configure_session()
    with connection.cursor() as cursor:  # Django leaves the connection's loader on its cursors
        assert cursor.cursor.adapters.get_loader(TIMESTAMPTZ, 0) is UtcTimestamptzLoader
    values = _read(TEXTS)
    assert values == django_values
    assert [v.tzinfo for v in values] == [UTC] * len(TEXTS)
    assert values[4] == datetime(2026, 10, 25, 10, 0, tzinfo=UTC)
    assert values[1] == datetime(1970, 1, 1, tzinfo=UTC) - timedelta(microseconds=1)
    run_values = list(Run.objects.filter(pk=-1).values_list("scheduled_for", flat=True))
    assert run_values == []  # the ORM's own reads go through it as well: no error on an empty read


def test_compiled_loader_raises_what_django_raises_for_infinity():
    connection.close()
    with pytest.raises(DataError) as django_error:
        _read(["infinity"])
    ledger.configure_session()
    with pytest.raises(DataError) as ours:
        _read(["infinity"])
    assert type(ours.value.__cause__) is type(django_error.value.__cause__)
    assert "infinity" in str(ours.value)


def test_other_time_zones_keep_djangos_loader():
    connection.close()
    connection.ensure_connection()
    raw = connection.connection
    assert use_compiled_timestamps(raw, timezone(timedelta(hours=1))) is False
    raw.execute("SET TIME ZONE 'Europe/Paris'")
    try:
        assert use_compiled_timestamps(raw, UTC) is False
        assert raw.adapters.get_loader(TIMESTAMPTZ, 0) is not UtcTimestamptzLoader
    finally:
        connection.close()
