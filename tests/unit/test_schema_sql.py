"""``scheduling/sql/schema.sql``: its blocks, in order, each one able to run again; and the
migrations' own SQL (``scheduling/migrations/sql/``): frozen, and the only SQL they run.

Whether the migrations reach schema.sql is ``tests/integration/test_schema.py``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import re
from pathlib import Path

import pytest
from django.db import migrations

from scheduling.sql import SCHEMA_FILE, parse_schema

MIGRATIONS = Path(__file__).resolve().parents[2] / "scheduling" / "migrations"

#: Each migration's SQL file and its SHA-256: the file is frozen history (a database migrated
#: with it long ago keeps what it ran), so a change of the schema is a new migration with a file
#: of its own, whose digest is added here (docs/development.md, Changing the schema).
FROZEN = {
    "0001_initial.sql": "466cbe1f1fbf33e5b99e8f5fdf8fac9786174b2f5992a5db12a33057230927a7",
    "0002_buffer_one.sql": "14da90a71d7a63a9dabd1a95c7fd895aca3ae491e628490be5f4793d089109b4",
    "0003_history_in_one_statement.sql":
        "c96fb80b6229f0288817fc5c0f2769092cfea9e0e1b68bfb3ce92cc3647825e3",
    "0004_guard_execution_functions.sql":
        "a0755c9ecedec393ca3f96fbd5fae398659e14789f576bc312844d4ece1ad6e9",
    "0007_history_pauses_no_bookkeeping.sql":
        "518097fca681a9792db121a64247c6781ccdaa48442b7cd97360d9ef9ffa4d86",
    "0008_overlap_replace_buffer_all.sql":
        "2c9a8c1f1c324a91f514ffe8fae1bf2ca906f98aad903287078c5f016aaae54a",
    "0009_pause_run_set_null.sql":
        "3f84de99d9e7c9dea9d6104784e7d9cc4d36449821e6817d8c2a9db0b7baadd5",
    "0010_release_locks_next_slot.sql":
        "2144dd960572b1249b8c7354a5be1d5a830b2a6b237cae8a75d2c4d693d3fc69",
}

BLOCKS = [
    "run_periodic_task_set_null", "pause_run_set_null", "execution_lock_key", "guard_execution",
    "run_due_at",
    "date_changed_not_ahead", "change_log", "history", "release_buffered",
]


def test_the_blocks_in_file_order():
    assert list(parse_schema(SCHEMA_FILE.read_text())) == BLOCKS


def test_every_statement_can_run_again():
    """A later migration runs a changed block on a database that has it (docs/development.md)."""
    text = SCHEMA_FILE.read_text()
    assert re.findall(r"^CREATE (?!OR REPLACE )\w+", text, re.MULTILINE) == []
    assert re.findall(r"^(?:ALTER|DROP) .*", text, re.MULTILINE) == [
        "ALTER TABLE scheduling_run", "ALTER TABLE scheduling_pause"
    ]
    for constraint in (
        "scheduling_run_periodic_task_id_9d64afac_fk_django_ce",
        "scheduling_pause_run_id_db20df94_fk_scheduling_run_id",
    ):
        assert f"    DROP CONSTRAINT {constraint},\n    ADD CONSTRAINT {constraint}\n" in text


def test_the_migrations_sql_files_are_the_frozen_ones():
    digests = {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted((MIGRATIONS / "sql").iterdir())
    }
    assert digests == FROZEN, (
        "a migration's SQL file is frozen history: change the schema with a new migration "
        "(docs/development.md, Changing the schema), and list a new file's digest in FROZEN"
    )


def test_no_migration_imports_the_app():
    """Nothing of ``scheduling`` (its models, ``scheduling.sql`` and schema.sql): a migration
    runs what it was made with, whatever the app says later."""
    imported = {}
    for path in sorted(MIGRATIONS.glob("0*.py")):
        tree = ast.parse(path.read_text())
        imported[path.stem] = sorted(
            {alias.name.partition(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names}
            | {node.module.partition(".")[0] for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.module}
        )
    allowed = {"django", "pathlib"}
    assert {name: found for name, found in imported.items() if set(found) - allowed} == {}
    assert len(imported) == len(list(MIGRATIONS.glob("0*.py"))) > 5


@pytest.mark.parametrize("name", [name.removesuffix(".sql") for name in FROZEN])
def test_a_migration_runs_its_own_file(name):
    operations = importlib.import_module(f"scheduling.migrations.{name}").Migration.operations
    text = (MIGRATIONS / "sql" / f"{name}.sql").read_text()
    assert [op.sql for op in operations if isinstance(op, migrations.RunSQL)
            and op.sql == text] == [text]


def test_a_block_loses_its_leading_comments_and_keeps_its_body():
    text = (
        "-- header of the file\n\n-- a --\n-- what a is\nCREATE OR REPLACE FUNCTION a() AS $$\n"
        "-- the body's own comment\n$$;\n\n-- b --\nSELECT 2;\n"
    )
    assert parse_schema(text) == {
        "a": "CREATE OR REPLACE FUNCTION a() AS $$\n-- the body's own comment\n$$;",
        "b": "SELECT 2;",
    }
    with pytest.raises(ValueError, match="block 'a' given twice"):
        parse_schema("-- a --\nSELECT 1;\n-- a --\nSELECT 2;\n")
