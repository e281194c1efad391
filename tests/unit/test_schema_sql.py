"""``scheduling/sql/schema.sql``: its blocks, in order, each one able to run again."""

from __future__ import annotations

import re

import pytest

from scheduling.sql import SCHEMA_FILE, parse_schema, schema

BLOCKS = [
    "run_periodic_task_set_null", "execution_lock_key", "guard_execution", "run_due_at",
    "date_changed_not_ahead", "change_log", "history", "release_buffered",
]


def test_the_blocks_in_file_order():
    assert list(parse_schema(SCHEMA_FILE.read_text())) == BLOCKS


def test_every_statement_can_run_again():
    """A later migration runs a changed block on a database that has it (docs/development.md)."""
    text = SCHEMA_FILE.read_text()
    assert re.findall(r"^CREATE (?!OR REPLACE )\w+", text, re.MULTILINE) == []
    assert re.findall(r"^(?:ALTER|DROP) .*", text, re.MULTILINE) == ["ALTER TABLE scheduling_run"]
    assert "    DROP CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce,\n" \
        "    ADD CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce\n" in text


def test_blocks_are_chosen_by_name_and_come_in_file_order():
    both = schema("history", "execution_lock_key")
    assert both.startswith("CREATE OR REPLACE FUNCTION scheduling_execution_lock_key(")
    assert both.index("scheduling_execution_lock_key") < both.index("scheduling_record_history")
    assert "scheduling_run_due_at" not in both
    assert schema() == "\n\n".join(schema(name) for name in BLOCKS)
    with pytest.raises(KeyError, match="schema.sql has no block 'nothing'"):
        schema("nothing")


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
