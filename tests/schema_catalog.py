"""What a database's catalog says of the app's schema, as comparable values (no Django needed).

``catalog(conn)`` reads, in the connection's current schema: every function whose name starts
with ``scheduling_`` (``pg_get_functiondef``: arguments, options and body text), every trigger
that is not a constraint's own (``pg_get_triggerdef``; the app's are the only ones), and of the
tables ``scheduling_*``: their columns (type, length, nullability, default, identity; by name, not
position: a column added by a later migration of the old chain stands last), their indexes
(``pg_indexes``) and constraints (``pg_get_constraintdef``). Two databases hold the same schema
when their catalogs are equal; ``report`` says how two differ, as a diff of each definition.
"""

from __future__ import annotations

import difflib
from typing import Any

import psycopg

_QUERIES = {
    "functions": r"""
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
               pg_get_functiondef(p.oid)
        FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'scheduling\_%'
    """,
    "triggers": r"""
        SELECT t.tgrelid::regclass::text || '.' || t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
        WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace
    """,
    "indexes": r"""
        SELECT tablename || '.' || indexname, indexdef FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename LIKE 'scheduling\_%'
    """,
    "constraints": r"""
        SELECT c.conrelid::regclass::text || '.' || c.conname,
               c.contype::text || ' ' || pg_get_constraintdef(c.oid)
        FROM pg_constraint AS c JOIN pg_class AS t ON t.oid = c.conrelid
        WHERE t.relnamespace = current_schema()::regnamespace AND t.relname LIKE 'scheduling\_%'
    """,
    "columns": r"""
        SELECT table_name || '.' || column_name,
               concat_ws(' ', data_type, character_maximum_length, is_nullable, column_default,
                         is_identity, identity_generation)
        FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name LIKE 'scheduling\_%'
    """,
}


def catalog(conn: psycopg.Connection[Any]) -> dict[str, dict[str, str]]:
    """Return ``{kind: {object name: definition}}`` for the kinds above (see the module)."""
    found: dict[str, dict[str, str]] = {}
    for kind, query in _QUERIES.items():
        found[kind] = {name: definition for name, definition in conn.execute(query).fetchall()}
    return found


def catalog_of(url: str) -> dict[str, dict[str, str]]:
    """Return ``catalog`` of the database at ``url`` (a libpq URL), read in one connection."""
    with psycopg.connect(url) as conn:
        return catalog(conn)


def differences(
    first: dict[str, dict[str, str]], second: dict[str, dict[str, str]]
) -> dict[str, dict[str, tuple[str | None, str | None]]]:
    """Return ``{kind: {name: (first's definition, second's)}}`` of what two catalogs differ in
    (``None``: that catalog has no such object); ``{}`` when they are equal."""
    found: dict[str, dict[str, tuple[str | None, str | None]]] = {}
    for kind in sorted(set(first) | set(second)):
        a, b = first.get(kind, {}), second.get(kind, {})
        differing = {name: (a.get(name), b.get(name)) for name in sorted(set(a) | set(b))
                     if a.get(name) != b.get(name)}
        if differing:
            found[kind] = differing
    return found


def report(found: dict[str, dict[str, tuple[str | None, str | None]]], first: str,
           second: str) -> str:
    """Return ``differences``' result as text: per object, a unified diff of its definition in
    the catalog named ``first`` against the one named ``second`` (an object only one has: all
    its lines added or removed)."""
    parts = []
    for kind, objects in found.items():
        for name, (a, b) in objects.items():
            diff = difflib.unified_diff(
                (a or "").splitlines(), (b or "").splitlines(),
                f"{first}: {kind} {name}" + ("" if a is not None else " (absent)"),
                f"{second}: {kind} {name}" + ("" if b is not None else " (absent)"),
                lineterm="",
            )
            parts.append("\n".join(diff))
    return "\n\n".join(parts)
