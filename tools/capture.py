"""The chaos run's history, witnessed by the database: each committed change of a run row.

``Capture(ident)`` installs, for one chaos run, a row trigger on the run ledger
(``scheduling_run``) that fires only for that run's tasks (``periodic_task_name`` starting with
``"<ident> "``) and writes, in the transaction that changed the row, one row of its own table:
the row after (``to_jsonb``, without the columns it does not read) and the fields of the row
before that it compares, the session's ``clock_timestamp()`` at the change, the
transaction's start (``now()``: a claim's first statement is its ``SELECT ... FOR UPDATE SKIP
LOCKED``), its ``application_name`` (a replica's is ``scheduling-beat:<replica id>``; the chaos
tool names its workers' sessions ``PGAPPNAME=<worker name>``), its backend pid and transaction
id. Nothing in the product is involved: the component that changed the row wrote the witness,
in the same transaction, with the database clock. A change that rolled back leaves no witness,
as it leaves no effect: a claim that did not commit is no claim (its lock ended with the
transaction), and what it published is seen when a worker adopts the run.

``events(changes)`` turns the witnessed changes into history events (``tools.history``'s
kinds): planned, claimed, published, committed, adopted, started, suppressed, finished,
re-published, closed (with its reason). Every event carries ``at`` (aware UTC, ISO 8601, the
database clock of the session that made the change, except ``published``: the run's
``dispatched_at``, the ledger's own moment of the publish), ``process``, ``run``, ``task_id``,
``task``, ``slot`` and ``trigger``. The trigger's cost is one insert per changed run row, for
the chaos run's rows only; ``remove()`` drops the trigger, its function and its table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from tools.history import instant

#: The ``application_name`` prefix of a replica's scheduler session (``ledger.application_name``).
REPLICA_SESSION = "scheduling-beat:"
#: Run states from which a final status is the body's outcome (``finished``), not a closing.
_EXECUTING = ("running", "retrying")
_FINAL = ("succeeded", "failed", "missed", "skipped", "cancelled", "expired")

#: Columns of a run the history does not read: left out of the witness (the error text is long).
UNREAD = ("error", "task", "requested_by", "planned_at", "due_at", "overdue_at", "executions",
          "definition_version", "periodic_task_id", "slots")
_INSTALL = """
CREATE TABLE {table} (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    xact_at timestamptz NOT NULL DEFAULT now(),
    app text NOT NULL DEFAULT current_setting('application_name'),
    backend integer NOT NULL DEFAULT pg_backend_pid(),
    txid bigint NOT NULL DEFAULT txid_current(),
    old jsonb,
    new jsonb NOT NULL
);
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {table} (old, new) VALUES (
        CASE WHEN TG_OP = 'UPDATE' THEN jsonb_build_object(
            'status', OLD.status, 'started_at', OLD.started_at, 'finished_at', OLD.finished_at,
            'republished', OLD.republished, 'suppressed', OLD.suppressed
        ) END,
        to_jsonb(NEW) - ARRAY[{unread}]
    );
    RETURN NULL;
END $$;
CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE ON {run} FOR EACH ROW
    WHEN (NEW.periodic_task_name LIKE {prefix}) EXECUTE FUNCTION {function}();
"""
_REMOVE = """
DROP TRIGGER IF EXISTS {trigger} ON {run};
DROP FUNCTION IF EXISTS {function}();
DROP TABLE IF EXISTS {table};
"""
_READ = "SELECT seq, at, xact_at, app, backend, txid, old, new FROM {table} ORDER BY seq"


@dataclass(frozen=True)
class Change:
    """One witnessed change of a run row: ``old`` is None for an insert (rows as dicts)."""

    seq: int
    at: str
    xact_at: str
    app: str
    backend: int
    txid: int
    old: dict[str, Any] | None
    new: dict[str, Any]


class Capture:
    """The trigger, function and table of chaos run ``ident`` (``chaos-<hex>``), on Django's
    default database. ``install()`` before the run's processes start, ``changes()`` once they
    stopped, ``remove()`` in any case (idempotent)."""

    def __init__(self, ident: str) -> None:
        if not re.fullmatch(r"[a-z]+-[0-9a-z]+", ident):
            raise ValueError(f"not a chaos run's ident: {ident!r}")
        name = "history_" + ident.replace("-", "_")
        self.ident = ident
        self._names = {
            "table": sql.Identifier(name),
            "function": sql.Identifier(name),
            "trigger": sql.Identifier(name),
            "prefix": sql.Literal(f"{ident} %"),
            "unread": sql.SQL(", ").join(map(sql.Literal, UNREAD)),
        }

    def _execute(self, template: str) -> list[tuple[Any, ...]]:
        from django.db import connection

        from scheduling.models import Run

        connection.ensure_connection()
        raw = connection.connection
        statement = sql.SQL(template).format(run=sql.Identifier(Run._meta.db_table), **self._names)
        with raw.cursor() as cursor:
            cursor.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
        if not connection.in_atomic_block and not raw.autocommit:
            raw.commit()
        return rows

    def install(self) -> None:
        self._execute(_INSTALL)

    def remove(self) -> None:
        self._execute(_REMOVE)

    def changes(self) -> list[Change]:
        """Every witnessed change, in the order the rows were written."""
        return [
            Change(seq, instant(at), instant(xact_at), app, backend, txid, _row(old), _row(new))
            for seq, at, xact_at, app, backend, txid, old, new in self._execute(_READ)
        ]


def _row(value: str | dict[str, Any] | None) -> Any:
    """A row as a dict: Django's connection reads ``jsonb`` as text (its JSONField decodes)."""
    return json.loads(value) if isinstance(value, str) else value


def process_of(change: Change) -> str:
    """The replica id or worker name of the session that made ``change`` (its application
    name without the replica prefix), else ``backend <pid>``."""
    if change.app.startswith(REPLICA_SESSION):
        return change.app[len(REPLICA_SESSION) :]
    return change.app or f"backend {change.backend}"


def events(changes: list[Change]) -> Iterator[dict[str, Any]]:
    """The history events of ``changes`` (see the module docstring), in the changes' order."""
    for change in changes:
        yield from _events_of(change)


def _events_of(change: Change) -> Iterator[dict[str, Any]]:
    old, new = change.old, change.new
    base = {
        "run": new["id"],
        "task_id": new["task_id"],
        "task": new["periodic_task_name"],
        "slot": _utc(new["scheduled_for"]),
        "trigger": new["trigger"],
        "txid": change.txid,
    }
    by = process_of(change)

    def event(kind: str, at: str | None = None, process: str = by, **more: Any) -> dict[str, Any]:
        return {"kind": kind, "at": _utc(at or change.at), "process": process, **base, **more}

    status = new["status"]
    if old is None:
        yield event("planned", reason=new["reason"])
        if status in _FINAL:
            yield event("closed", status=status, reason=new["reason"])
        return
    before = old["status"]
    if before == "pending" and status == "running":
        yield event("adopted", process=new["worker"] or by)
    elif before == "pending" and status != "pending" and new["claimed_by"]:
        yield event("claimed", at=change.xact_at, process=new["claimed_by"])
        if status == "dispatched":
            yield event("published", at=new["dispatched_at"], process=new["claimed_by"])
            yield event("committed", process=new["claimed_by"], reason=new["reason"])
    if new["republished"] > old["republished"]:
        yield event("re-published", at=new["republished_at"], reason=new["reason"])
    for _ in range(new["suppressed"] - old["suppressed"]):
        yield event("suppressed", status=before)
    if status == "running" and new["started_at"] != old["started_at"]:
        yield event(
            "started",
            at=new["started_at"],
            process=new["worker"] or by,
            reason=new["reason"],
            retries=new["retries"],
        )
    if status in _FINAL and (status != before or new["finished_at"] != old["finished_at"]):
        yield event(_ending(before, status, new["reason"]), status=status, reason=new["reason"])


def _ending(before: str, status: str, reason: str) -> str:
    """``finished`` when a final status is the body's outcome, else ``closed`` (the run ended
    without one: not delivered, worker lost, expired, cancelled, a claim's decision)."""
    from scheduling.models import Run

    if status == Run.Status.SUCCEEDED or reason == Run.Reason.LATE_OUTCOME:
        return "finished"
    if reason in (Run.Reason.WORKER_LOST, Run.Reason.NOT_DELIVERED) or before not in _EXECUTING:
        return "closed"
    return "finished"


def _utc(value: str | None) -> str | None:
    """An ISO 8601 instant as Python writes it in UTC (PostgreSQL's JSON trims fractions)."""
    if value is None:
        return None
    return instant(datetime.fromisoformat(value))


def write(path: Any, records: list[dict[str, Any]]) -> int:
    """Write ``records`` as JSON lines to ``path`` (sorted by ``at``); return how many."""
    ordered = sorted(records, key=lambda r: r.get("at") or "")
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(record, default=str) + "\n" for record in ordered)
    return len(ordered)
