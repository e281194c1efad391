"""The scheduler's connections read ``timestamptz`` with psycopg's compiled loader.

Django registers its own loader for ``timestamptz`` on every PostgreSQL connection
(``django.db.backends.postgresql.psycopg_any.BaseTzLoader``): a subclass of psycopg's pure-Python
loader that replaces each value's tzinfo with the connection's time zone. It parses every value in
Python, about 5.5 microseconds each against 0.6 for the compiled loader of psycopg's binary
package, and a replica reads many: every claimed run brings about eight timestamps, every row of
the change log two. In a herd of 3,000 runs due at one instant it was 10 % to 26 % of the replicas'
CPU (py-spy).

``use_compiled_timestamps`` registers ``UtcTimestamptzLoader`` on a replica's connection when
Django's time zone for it and the session's ``TimeZone`` are both UTC (Django sets the session's
to its own when it connects): then the compiled loader, which gives each value the session's time
zone, gives the same aware UTC datetimes Django's does. Any other setup keeps Django's loader.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.adapt import Loader
from psycopg.postgres import types
from psycopg.pq import Format

TIMESTAMPTZ = types["timestamptz"].oid
#: psycopg's default text loader of timestamptz: the compiled one where psycopg's binary (or C)
#: package is installed, else its Python one.
_COMPILED = psycopg.adapters.get_loader(TIMESTAMPTZ, Format.TEXT)


class UtcTimestamptzLoader(Loader):
    """``timestamptz`` text to an aware UTC datetime, by psycopg's default (compiled) loader.

    ``timezone`` is what Django's ``create_cursor`` compares with its connection's time zone
    before it registers its own loader on a cursor: equal, so it leaves this one in place. Raises
    what psycopg's loader raises (``psycopg.DataError`` for a value out of Python's range).
    """

    timezone = UTC

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._load = _COMPILED(oid, context).load

    def load(self, data: Any) -> datetime:
        """One value, as the server sent it in the session's ``TimeZone`` (UTC)."""
        return self._load(data)


def use_compiled_timestamps(raw: psycopg.Connection[Any], timezone: Any) -> bool:
    """Register ``UtcTimestamptzLoader`` on ``raw`` (a Django connection's psycopg connection,
    Django's time zone for it ``timezone``) when both are UTC; return whether it did."""
    if timezone is not UTC or raw.info.timezone is not UTC:
        return False
    raw.adapters.register_loader(TIMESTAMPTZ, UtcTimestamptzLoader)
    return True
