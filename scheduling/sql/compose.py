"""The statements whose text follows the ``Run`` model's columns, composed with ``psycopg.sql``.

The only module that builds SQL text at run time. Each statement is one short ``unnest`` over one
typed array per column, whatever the number of rows (Django's ``bulk_create`` compiles a
placeholder and an expression per value, which dominated the cost of a claim batch). Column lists
come from the model, so a new column needs no edit here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from psycopg import sql

from scheduling.models import Run

#: Columns of a newly planned run that come from its task and slot; the others take their defaults.
PLAN_COLUMNS = (
    "periodic_task_id", "periodic_task_name", "task", "scheduled_for", "due_at", "task_id",
    "definition_version",
)


def insert_fields() -> list[Field]:
    """The columns an insert writes: all but the id and ``planned_at`` (database defaults)."""
    return [f for f in Run._meta.concrete_fields if f.name not in ("id", "planned_at")]


def _arrays(fields: list[Field], connection: BaseDatabaseWrapper) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.SQL("%s::{}[]").format(sql.SQL(f.db_type(connection))) for f in fields
    )


def _columns(fields: list[Field]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(f.column) for f in fields)


def insert_runs(connection: BaseDatabaseWrapper) -> str:
    """``INSERT`` of runs from one array per ``insert_fields()`` column; conflicts dropped."""
    fields = insert_fields()
    return _text(
        sql.SQL(
            "INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING"
        ).format(
            table=sql.Identifier(Run._meta.db_table),
            columns=_columns(fields),
            arrays=_arrays(fields, connection),
        ),
        connection,
    )


def insert_pending(connection: BaseDatabaseWrapper) -> tuple[str, list[Field], list[Field]]:
    """``INSERT`` of pending scheduled runs from the six ``PLAN_COLUMNS`` arrays.

    Returns ``(statement, constant fields, varying fields)``: the parameters are one value per
    constant field (the column's default), then one array per varying field, in those orders.
    """
    fields = insert_fields()
    varying = [f for f in fields if f.attname in PLAN_COLUMNS]
    constant = [f for f in fields if f.attname not in PLAN_COLUMNS]
    statement = sql.SQL(
        "INSERT INTO {table} ({columns}) SELECT v.*, {constants} FROM unnest({arrays}) AS v"
        " ON CONFLICT DO NOTHING"
    ).format(
        table=sql.Identifier(Run._meta.db_table),
        columns=_columns([*varying, *constant]),
        constants=sql.SQL(", ").join(
            sql.SQL("%s::{}").format(sql.SQL(f.db_type(connection))) for f in constant
        ),
        arrays=_arrays(varying, connection),
    )
    return _text(statement, connection), constant, varying


def update_runs(names: tuple[str, ...], connection: BaseDatabaseWrapper) -> tuple[str, list[Field]]:
    """``UPDATE`` of the fields ``names`` of runs by primary key, from one array per field.

    Returns ``(statement, fields)``: the parameters are one array per field, the id first.
    """
    fields = [Run._meta.pk, *(Run._meta.get_field(name) for name in names)]
    columns = [sql.Identifier(f.column) for f in fields]
    statement = sql.SQL(
        "UPDATE {table} AS r SET {assignments} FROM unnest({arrays}) AS v({columns})"
        " WHERE r.id = v.id"
    ).format(
        table=sql.Identifier(Run._meta.db_table),
        columns=sql.SQL(", ").join(columns),
        arrays=_arrays(fields, connection),
        assignments=sql.SQL(", ").join(sql.SQL("{} = v.{}").format(c, c) for c in columns[1:]),
    )
    return _text(statement, connection), fields


def array(values: Sequence[object]) -> object:
    """``values`` in PostgreSQL's text form of a one-dimensional array, for a ``%s::type[]``.

    The bulk writes send one array per column, and psycopg's list dumper adapts each element in
    a Python loop: about a twentieth of a replica's CPU in a burst, profiled. This
    writes the literal in one join: ``NULL`` for None, ``t``/``f``, decimal integers, and aware
    datetimes (ISO 8601 with their offset) and strings double-quoted, a backslash before each
    ``"`` and ``\\`` (PostgreSQL's array input rules). Any other element (a naive datetime, a
    float, a dict) leaves the list as it is, for psycopg to adapt.
    """
    items = []
    for value in values:
        if value is None:
            items.append("NULL")
        elif value is True or value is False:
            items.append("t" if value else "f")
        elif isinstance(value, int):
            items.append(str(int(value)))
        elif isinstance(value, str):
            items.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif isinstance(value, datetime) and value.utcoffset() is not None:
            items.append('"' + value.isoformat() + '"')
        else:
            return values
    return "{" + ",".join(items) + "}"


def literal(value: str) -> str:
    """``value`` as a quoted SQL literal (psycopg's quoting), to write into a statement."""
    return sql.Literal(str(value)).as_string()


def _text(statement: sql.Composable, connection: BaseDatabaseWrapper) -> str:
    connection.ensure_connection()
    return statement.as_string(connection.connection)
