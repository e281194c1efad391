"""A connection pooler between the app and PostgreSQL: telling one is there, and what it keeps.

A pooler by transaction (PgBouncer's ``pool_mode = transaction``, RDS Proxy, Supavisor) lends its
client a server session for one transaction at a time. What a session keeps between transactions
does not follow the client:

- a session setting (``SET``, ``set_config(..., false)``) stays on the server session that ran it,
  for the pooler's next client there, and is missing from the client's next transaction;
- a session-level advisory lock stays on that server session: its owner cannot release it from
  another one, and whoever is lent that session next holds it too (advisory locks are
  re-entrant), so the lock proves nothing;
- a protocol-level prepared statement exists on one server session only, unless the pooler
  keeps prepared statements per client (PgBouncer 1.21 and later with
  ``max_prepared_statements`` above 0 prepares them again on whichever server it lends).

So the app's two session-level locks (the reconcile turn, the guard's execution locks) go through
``SCHEDULING_DIRECT_DATABASE``, a connection without a pooler (system check scheduling.E003), the
scheduler's bounds are set per transaction on a pooled connection (``session.configure_session``),
and the claim is prepared only where the statement is kept (``keeps_prepared``).

Telling a pooler is there: at login PostgreSQL gives the client its server process id (the
BackendKeyData message, which libpq keeps as ``PQbackendPID`` and a cancel request sends back). A
pooler answers the login itself with a key of its own, so the id the connection was given is not
``pg_backend_pid()`` of the server that runs its queries. One query, and no guess: on a direct
connection (or through a plain TCP proxy) the two are always equal. A pooler by session is seen
too; it keeps session state, but nothing a client can ask tells it from one by transaction.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any

from django.db import connections
from psycopg import sql

from scheduling.sql import queries

logger = logging.getLogger(__name__)

_CACHE = "_scheduling_pooler"


def behind_pooler(raw: Any) -> bool:
    """Whether the psycopg connection ``raw`` reaches PostgreSQL through a pooler (one query).

    Runs ``pg_backend_pid()`` in the connection's current transaction, or in a transaction of its
    own when in autocommit.
    """
    server_pid = raw.execute(queries["server_pid"]).fetchone()[0]
    return int(server_pid) != int(raw.info.backend_pid)


def pooler_keeps_prepared(raw: Any) -> bool:
    """Whether a pooled psycopg connection ``raw`` may send protocol-level prepared statements.

    Prepares a statement of a name unique to this call (libpq's ``PQprepare``, a protocol-level
    Parse) and looks for that name among the server session's ``pg_prepared_statements``, in one
    transaction, so on one server session. Found: the pooler passed the statement through to that
    session alone (PgBouncer before 1.21, or ``max_prepared_statements = 0``), and it is
    deallocated again before the transaction ends: False. Not found: the pooler keeps the
    statement itself and prepares it under a name of its own on every server session it lends
    this client (PgBouncer 1.21+): True. A pooler that refuses the Parse: False.
    """
    name = f"scheduling_probe_{os.getpid()}_{secrets.token_hex(4)}"
    with raw.transaction():
        result = raw.pgconn.prepare(name.encode(), queries["database_now"].encode())
        if result.error_message:
            raise _Refused(result.error_message.decode(errors="replace"))
        found = raw.execute(queries["prepared_named"], [name]).fetchone()[0]
        if found:
            raw.execute(sql.SQL("DEALLOCATE {}").format(sql.Identifier(name)))
    return not found


class _Refused(Exception):
    """The pooler or server refused the probe's Parse (the transaction is rolled back)."""


def _probe_prepared(raw: Any) -> bool:
    try:
        return pooler_keeps_prepared(raw)
    except _Refused as exc:
        logger.info("the pooler refused a prepared statement (%s): claims are sent unprepared", exc)
        return False


def pooled(using: str = "default") -> bool:
    """Whether Django's connection ``using`` goes through a pooler (asked once per connection)."""
    return _known(using, "pooled", behind_pooler)


def keeps_prepared(using: str = "default") -> bool:
    """Whether connection ``using`` keeps protocol-level prepared statements between transactions.

    True on a direct connection; behind a pooler, what ``pooler_keeps_prepared`` finds (asked
    once per connection).
    """
    if not pooled(using):
        return True
    return _known(using, "prepared", _probe_prepared)


def _known(using: str, what: str, ask: Any) -> bool:
    """``ask(raw)`` of connection ``using``, remembered for as long as that connection lives."""
    connection = connections[using]
    connection.ensure_connection()
    raw = connection.connection
    cache = connection.__dict__.get(_CACHE)
    if cache is None or cache["raw"] is not raw:
        cache = connection.__dict__[_CACHE] = {"raw": raw}
    if what not in cache:
        cache[what] = bool(ask(raw))
    return cache[what]


def report_pooled_locks(alias: str, what: str) -> None:
    """Log that ``what`` (session-level advisory locks) sit on ``alias``, a pooled connection.

    An error, with the fix, unless the project silenced system check scheduling.E003 (a pooler
    by session keeps the locks: silencing the check says so).
    """
    from django.conf import settings

    silenced = "scheduling.E003" in getattr(settings, "SILENCED_SYSTEM_CHECKS", ())
    logger.log(
        logging.INFO if silenced else logging.ERROR,
        "session-level advisory locks (%s) on database alias %r, which goes through a "
        "connection pooler: in transaction mode they are neither held nor released reliably. "
        "Set SCHEDULING_DIRECT_DATABASE to an alias that connects without the pooler "
        "(system check scheduling.E003)", what, alias,
        extra={"action": "pooled_locks"},
    )
