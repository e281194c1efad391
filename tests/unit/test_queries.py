"""The named statements of ``scheduling/sql/queries.sql``: each used, none missing, tables named once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduling.sql import QUERIES_FILE, parse, queries

APP = Path(__file__).resolve().parents[2] / "scheduling"
USED = re.compile(r"""queries\[\s*(?:"(\w+)"|"(\w+)" if .*? else "(\w+)")\s*\]""")


def _used_names() -> set[str]:
    names: set[str] = set()
    for path in APP.rglob("*.py"):
        for match in USED.finditer(path.read_text()):
            names.update(name for name in match.groups() if name)
    return names


def test_every_statement_is_used_and_every_used_one_exists():
    assert _used_names() == set(queries)


def test_no_table_name_is_written_into_a_statement():
    """Tables are ``{run}`` and friends, filled from the models: a renamed table needs no edit."""
    text = QUERIES_FILE.read_text()
    assert re.findall(r"\b(scheduling_run|scheduling_replica|django_celery_beat_\w+)\b", text) == []
    assert "FROM scheduling_run r" in queries["running_without_lock"]


def test_fragments_are_filled_in_and_comments_dropped():
    close = queries["close_lost"]
    assert close.startswith("WITH held AS MATERIALIZED (")
    assert "scheduling_execution_lock_key(r.task_id, r.retries)" in close
    assert "--" not in close and "{" not in close
    assert not any(name.startswith("fragment_") for name in queries)


def test_a_name_given_twice_is_an_error():
    with pytest.raises(ValueError, match="block 'poll' given twice"):
        parse("-- poll --\nSELECT 1\n\n-- poll --\nSELECT 2\n")
    assert parse("-- a --\n-- what it is\nSELECT 1\n\n-- b --\nSELECT 2\n") == {
        "a": "SELECT 1", "b": "SELECT 2"
    }
