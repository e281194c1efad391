"""The serviceless broker: kombu's SQL transport on the project's PostgreSQL, polling faster, with
redelivery of the messages a dead consumer never acknowledged.

kombu's virtual transports poll; the SQL transport's default of one second would leave workers a
second behind beat, and its ``polling_interval`` transport option cannot be used because the SQL
transport hands every option to ``create_engine``. This subclass sets it, and is registered as the
transport alias ``sqlpoll`` (URL ``sqlpoll+postgresql+psycopg://...``), by name
(``embedded.register_sql_broker``): kombu imports this module, and SQLAlchemy, on first use.

Stock kombu marks a delivered message ``visible = false`` and never looks at it again, so the
messages a SIGKILLed worker had received (executing, or prefetched and not yet started) are lost.
Here, as with Redis's visibility timeout, a delivery stamps the row's ``timestamp`` with the
delivery time, an acknowledgement clears it, and a row delivered longer ago than
``visibility_timeout`` seconds (transport option, default 3600) and still not acknowledged is
delivered again with ``delivery_info["redelivered"]`` set; the worker guard then decides whether
it executes (``scheduling.guard``). Waiting and stale rows are served oldest first, so a steady
stream of new messages cannot starve a redelivery. Delivered rows are kept (``visible = false``).
"""

from __future__ import annotations

import os
from queue import Empty
from typing import Any

from kombu.transport.sqlalchemy import Channel as SQLChannel
from kombu.transport.sqlalchemy import Transport as SQLTransport
from kombu.transport.sqlalchemy.models import metadata
from kombu.utils.json import loads
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError, PendingRollbackError

#: ``application_name`` of the broker's PostgreSQL sessions, followed by ``:<pid>``.
APPLICATION_NAME = "kombu-sqlpoll"
#: Transport options this module reads; the others go to ``create_engine`` as kombu does.
OWN_OPTIONS = ("visibility_timeout",)
#: Property of a delivered message naming its row, so that the acknowledgement can find it.
ROW = "sqlpoll_row"
#: Key of the transaction-level advisory lock under which a process creates the broker's tables.
TABLES_LOCK = 0x5C4ED020


class Channel(SQLChannel):
    """kombu's SQL channel with acknowledgements recorded and unacknowledged rows redelivered."""

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        options = connection.client.transport_options
        self.visibility_timeout = float(options.get("visibility_timeout", 3600))
        super().__init__(connection, **kwargs)

    def _engine_from_config(self) -> Any:
        client = self.connection.client
        options = {
            k: v for k, v in client.transport_options.items()
            if k not in (*OWN_OPTIONS, "queue_tablename", "message_tablename", "callback",
                         "errback", "max_retries", "interval_start", "interval_step",
                         "interval_max", "retry_errors")
        }
        # Each process's broker sessions are named, so pg_stat_activity tells them apart from the
        # application's (and the chaos tool can cut one process's: tools/brokers.py).
        connect_args = dict(options.pop("connect_args", None) or {})
        connect_args.setdefault("application_name", f"{APPLICATION_NAME}:{os.getpid()}")
        engine = create_engine(client.hostname, connect_args=connect_args, **options)
        # kombu creates its tables in each process on first use, and processes starting at once
        # on a new database collided on CREATE TABLE (a replica's first publish failed): one at a
        # time here, and kombu's own create_all then finds them.
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": TABLES_LOCK})
            metadata.create_all(connection)
        return engine

    def _get_or_create(self, queue: str) -> Any:
        """kombu's, but a queue row created meanwhile by another consumer is found, not fatal.

        Stock kombu catches only OperationalError around the INSERT, so two workers starting at
        once on a new queue could kill one of them with a unique violation.
        """
        try:
            return super()._get_or_create(queue)
        except IntegrityError:
            self.session.rollback()
            return super()._get_or_create(queue)

    def _get(self, queue: str) -> dict[str, Any]:
        """Deliver the oldest waiting message, or one delivered too long ago and not acked.

        The SQL names kombu's default message table as a literal (no SQL is built from strings);
        the ``message_tablename`` transport option is not supported.
        """
        if self.message_tablename != "kombu_message":
            raise NotImplementedError("the sqlpoll transport uses the table kombu_message only")
        queue_id = self._get_or_create(queue).id
        try:  # committed only when it worked (kombu commits in a ``finally``: see below)
            row = self.session.execute(
                text(
                    "WITH picked AS (SELECT id, visible FROM kombu_message"
                    " WHERE queue_id = :queue AND (visible OR timestamp < localtimestamp"
                    " - make_interval(secs => :timeout)) ORDER BY id LIMIT 1"
                    " FOR UPDATE SKIP LOCKED)"
                    " UPDATE kombu_message AS m SET visible = false,"
                    " timestamp = localtimestamp FROM picked WHERE m.id = picked.id"
                    " RETURNING m.id, m.payload, picked.visible"
                ),
                {"queue": queue_id, "timeout": self.visibility_timeout},
            ).first()
        except Exception:
            # A session cut mid-poll: the commit would raise PendingRollbackError, which Celery
            # does not recover from, in place of the connection error it does (found by the
            # chaos run: the worker died). Rolled back, the message is delivered by a later poll.
            self.session.rollback()
            raise
        self.session.commit()
        if row is None:
            raise Empty()
        payload = loads(row.payload)
        properties = payload.setdefault("properties", {})
        properties[ROW] = row.id
        if not row.visible:
            properties.setdefault("delivery_info", {})["redelivered"] = True
        return payload

    def _acked(self, message: Any) -> None:
        """Mark the delivered row acknowledged (``timestamp`` NULL): it is never redelivered.

        On a pooled connection of its own, not the channel's session: Celery acknowledges from
        other threads than the one polling, and a SQLAlchemy session is not thread-safe.
        """
        row = (getattr(message, "properties", None) or {}).get(ROW)
        if row is None:
            return
        engine, _ = self._open()
        with engine.begin() as connection:
            connection.execute(
                text("UPDATE kombu_message SET timestamp = NULL WHERE id = :id"),
                {"id": row},
            )

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        self._acked(self.qos._delivered.get(delivery_tag))
        super().basic_ack(delivery_tag, multiple)

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        message = self.qos._delivered.get(delivery_tag)
        super().basic_reject(delivery_tag, requeue)  # a requeue puts a new copy first
        self._acked(message)

    def _restore(self, message: Any) -> None:
        """Put a copy back (a warm shutdown's unacked messages); the delivered row is done."""
        super()._restore(message)
        self._acked(message)


class Transport(SQLTransport):
    """kombu's SQL transport, polling every 0.1 s, redelivering unacknowledged messages."""

    Channel = Channel
    polling_interval = 0.1
    #: A session left broken by any other path is a connection lost too: the consumer reconnects
    #: on a new channel (a new session) instead of dying.
    connection_errors = (*SQLTransport.connection_errors, PendingRollbackError)

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """kombu's, but a timed wait lasts one polling interval while no channel may take a
        message (each prefetch slot holds one not yet acknowledged).

        Celery's worker loop waits here with a 2 s timeout and, before Celery 5.7, handles acks
        only between two waits: with every prefetch slot full, kombu's loop would sleep out the
        whole timeout before the acks that free a slot are sent, and a busy queue drains at a
        few messages per 2 s.
        """
        if timeout is not None and not any(ch.qos.can_consume() for ch in self.channels):
            timeout = min(timeout, self.polling_interval)
        super().drain_events(connection, timeout=timeout)

