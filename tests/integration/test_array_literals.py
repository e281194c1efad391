"""The bulk writes' arrays, written as PostgreSQL array literals (``compose.array``), read back
by PostgreSQL as the values they were made from: quotes, backslashes, braces, commas, spaces,
the word NULL, empty strings, non-ASCII text, NULLs, booleans, big integers and aware datetimes
in several zones. Any other element leaves the list for psycopg to adapt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from scheduling.models import Run
from scheduling.sql import compose

pytestmark = pytest.mark.django_db

AWKWARD = [
    'a "quoted" word', "back\\slash", "\\", '"', "{braces}", "a,b", " spaced ", "NULL", "null",
    "", "tab\there", "new\nline", "Zürich: 東京 ✓", "'single'", None, Run.Status.DISPATCHED,
]


def _read(literal: object, kind: str) -> list[object]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT %s::{kind}[]", [literal])
        return cursor.fetchone()[0]


def test_strings_come_back_as_they_were():
    literal = compose.array(AWKWARD)

    assert isinstance(literal, str)
    assert _read(literal, "text") == [None if v is None else str(v) for v in AWKWARD]
    assert _read(literal, "varchar(255)") == [None if v is None else str(v) for v in AWKWARD]


def test_integers_booleans_and_nulls_come_back_as_they_were():
    numbers = [0, -1, 2**62, None, 7]
    flags = [True, False, None]

    assert compose.array(numbers) == "{0,-1,4611686018427387904,NULL,7}"
    assert _read(compose.array(numbers), "bigint") == numbers
    assert _read(compose.array(flags), "boolean") == flags
    assert _read(compose.array([]), "integer") == []


def test_aware_datetimes_come_back_as_the_same_instants():
    instants = [
        datetime(2026, 3, 29, 0, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 3, 29, 3, 0, 0, 1, tzinfo=ZoneInfo("Europe/Berlin")),
        datetime(2026, 12, 5, 4, 30, tzinfo=timezone(timedelta(hours=-3, minutes=-30))),
        None,
    ]

    assert _read(compose.array(instants), "timestamptz") == instants


def test_other_elements_are_left_to_psycopg():
    naive = [datetime(2026, 1, 1, 12, 0)]
    mixed = [1, 2.5]

    assert compose.array(naive) is naive
    assert compose.array(mixed) is mixed
