"""The serviceless broker: kombu's SQL transport on the project's PostgreSQL, polling faster.

kombu's virtual transports poll; the SQL transport's default of one second would leave workers a
second behind beat, and its ``polling_interval`` transport option cannot be used because the SQL
transport hands every option to ``create_engine``. This subclass sets it, and is registered as the
transport alias ``sqlpoll`` (URL ``sqlpoll+postgresql+psycopg://...``).
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport.sqlalchemy import Transport as SQLTransport

ALIAS = "sqlpoll"


class Transport(SQLTransport):
    """kombu's SQL transport, polling every 0.1 s."""

    polling_interval = 0.1


TRANSPORT_ALIASES.setdefault(ALIAS, "project.broker:Transport")
