"""Run statuses, reasons, triggers and policy names are written once, in the Python enums: the
SQL files hold placeholders (``scheduling.sql.names``), filled when the files are read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduling.models import Run, TaskPolicy
from scheduling.sql import QUERIES_FILE, SCHEMA_FILE
from scheduling.sql.names import enum_values, fill, literals

#: A SQL string literal: quotes, then anything but a quote or a doubled quote.
STRING = re.compile(r"'((?:[^']|'')*)'")


def spelled(text: str, values: frozenset[str]) -> list[tuple[int, str]]:
    """(line, value) for each string literal of ``text`` that spells one of ``values``,
    comments included (a comment that names a status names it as ``{status.x}`` too)."""
    return [
        (number, match.group(1).replace("''", "'"))
        for number, line in enumerate(text.splitlines(), 1)
        for match in STRING.finditer(line)
        if match.group(1).replace("''", "'") in values
    ]


@pytest.mark.parametrize("path", [QUERIES_FILE, SCHEMA_FILE], ids=lambda p: p.name)
def test_no_sql_file_spells_a_status_reason_trigger_or_policy_name(path: Path):
    assert spelled(path.read_text(), enum_values()) == []


def test_the_rule_catches_a_spelled_name():
    text = "WHERE status = 'running'\n  AND reason = 'worker lost' AND x = 'client backend'\n"
    assert spelled(text, enum_values()) == [(1, "running"), (2, "worker lost")]


def test_placeholders_are_filled_with_the_enums_values():
    text = (
        "status = {status.pending} AND overlap_policy IN ({overlap.skip}, {overlap.buffer_one})"
        " AND status IN ({unfinished}) AND reason = {reason.worker_lost}"
        " AND trigger = {trigger.schedule} AND '{{}}'::jsonb = '{}'::jsonb"
    )
    assert fill(text) == (
        "status = 'pending' AND overlap_policy IN ('skip', 'buffer_one')"
        " AND status IN ('dispatched', 'running', 'retrying') AND reason = 'worker lost'"
        " AND trigger = 'schedule' AND '{{}}'::jsonb = '{}'::jsonb"
    )


def test_the_policy_lists_are_the_models():
    assert fill("IN ({watching}) OR IN ({buffering})") == (
        "IN ('skip', 'buffer_one', 'buffer_all', 'replace')"
        " OR IN ('buffer_one', 'buffer_all', 'replace')"
    )
    assert [p for p in TaskPolicy.Overlap if p not in TaskPolicy.WATCHING] == ["allow"]


def test_every_member_has_a_placeholder_and_an_unknown_one_is_refused():
    got = literals()
    assert got["status.buffered"] == f"'{Run.Status.BUFFERED}'"
    assert got["misfire.catch_up"] == f"'{TaskPolicy.Misfire.CATCH_UP}'"
    assert got["reason.not_delivered"] == f"'{Run.Reason.NOT_DELIVERED}'"
    assert len([k for k in got if k.startswith("status.")]) == len(Run.Status)
    with pytest.raises(KeyError, match=r"no enum member for the SQL placeholder \{status.lost\}"):
        fill("status = {status.lost}")
