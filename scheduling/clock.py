"""The database clock: what is due, and every time the ledger records, is the server's time.

Invariant 5: replicas with skewed clocks never dispatch early or twice, because no decision reads a
replica's own wall clock. These are read-only: expressions for querysets, and one query.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connections
from django.db.models import DateTimeField, Func

from scheduling.sql import queries


class ClockTimestamp(Func):
    """PostgreSQL's ``clock_timestamp()``: the database's wall clock, not the transaction start."""

    template = "clock_timestamp()"
    output_field = DateTimeField()


def database_now(using: str = "default") -> datetime:
    """Return the database's ``clock_timestamp()`` (aware, UTC)."""
    with connections[using].cursor() as cursor:
        cursor.execute(queries["database_now"])
        return cursor.fetchone()[0]
