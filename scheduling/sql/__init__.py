"""Every static SQL statement of the app, by name, from ``queries.sql`` beside this file; the
reader of ``schema.sql``, the current state of the app's functions and triggers.

``queries["poll"]`` is the text of the block ``-- poll --``, ready for ``cursor.execute``. The
file is read and the tables' names filled in on first use (Django must be set up then: the names
are the models' ``db_table``), never at import. Statements whose text depends on the model's
columns (the bulk writers) are composed with ``psycopg.sql`` in ``scheduling.sql.compose`` only.

Neither file spells a run status, reason, trigger or policy name: each writes a placeholder
(``{status.pending}``) filled from the Python enums when it is read (``scheduling.sql.names``).

``schema_blocks()["history"]`` is the SQL of the block ``-- history --`` of ``schema.sql``, its
placeholders filled: the text a new migration's SQL file holds. No migration reads that file:
each runs the SQL frozen beside it (``scheduling/migrations/sql/``), and the tests check that
the migrations reach the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

from scheduling.sql.names import fill

QUERIES_FILE = Path(__file__).with_name("queries.sql")
SCHEMA_FILE = Path(__file__).with_name("schema.sql")

#: Key of the transaction-level advisory lock that serializes CELERY_BEAT_SCHEDULE syncs.
BEAT_SCHEDULE_LOCK = 0x5C4ED01E
#: Key of the session-level advisory lock a replica holds while it reconciles (the turn).
RECONCILE_LOCK = 0x5C4ED01F

_BLOCK = re.compile(r"^-- (\w+) --$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Return ``{name: statement}`` of a queries file: comment lines dropped, text stripped.

    Raises ValueError for a name given twice.
    """
    return {
        name: "\n".join(
            line for line in body.splitlines() if not line.lstrip().startswith("--")
        ).strip()
        for name, body in _blocks(text).items()
    }


def parse_schema(text: str) -> dict[str, str]:
    """Return ``{name: SQL}`` of a schema file, in the file's order: each block without its
    leading comment lines (comment lines inside a function's body are the body's own and stay).

    Raises ValueError for a name given twice.
    """
    found = {}
    for name, body in _blocks(text).items():
        lines = body.strip().splitlines()
        while lines and lines[0].startswith("--"):
            lines.pop(0)
        found[name] = "\n".join(lines).strip()
    return found


def schema_blocks() -> dict[str, str]:
    """Return ``{name: SQL}`` of ``schema.sql`` in the file's order, its placeholders filled from
    the enums (Django must be set up): what the database's functions and triggers must be."""
    return parse_schema(fill(SCHEMA_FILE.read_text()))


def _blocks(text: str) -> dict[str, str]:
    """Return ``{name: text after the name's line}`` of a file of ``-- name --`` blocks."""
    split = _BLOCK.split(text)[1:]
    blocks: dict[str, str] = {}
    for name, body in zip(split[::2], split[1::2], strict=True):
        if name in blocks:
            raise ValueError(f"block {name!r} given twice")
        blocks[name] = body
    return blocks


@cache
def _load() -> dict[str, str]:
    """Read ``queries.sql`` and fill in the tables' names and the fragments (once a process)."""
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        PeriodicTasks,
        SolarSchedule,
    )

    from scheduling.models import (
        OwedRunCount,
        Pause,
        Replica,
        Run,
        ScheduleChange,
        TaskPolicy,
        TaskVersion,
    )

    names = {
        "run": Run._meta.db_table,
        "periodic_task": PeriodicTask._meta.db_table,
        "change_marker": PeriodicTasks._meta.db_table,
        "interval_schedule": IntervalSchedule._meta.db_table,
        "crontab_schedule": CrontabSchedule._meta.db_table,
        "solar_schedule": SolarSchedule._meta.db_table,
        "clocked_schedule": ClockedSchedule._meta.db_table,
        "pause": Pause._meta.db_table,
        "replica": Replica._meta.db_table,
        "task_policy": TaskPolicy._meta.db_table,
        "task_version": TaskVersion._meta.db_table,
        "schedule_change": ScheduleChange._meta.db_table,
        "owed_run_count": OwedRunCount._meta.db_table,
    }
    blocks = parse(fill(QUERIES_FILE.read_text()))
    fragments: dict[str, str] = {}
    for name, text in blocks.items():  # a fragment may use the fragments given before it
        if name.startswith("fragment_"):
            fragments[name] = text.format(**names, **fragments)
    return {
        name: text.format(**names, **fragments)
        for name, text in blocks.items()
        if not name.startswith("fragment_")
    }


class _Queries(Mapping[str, str]):
    """The named statements, loaded on first access (see the module docstring)."""

    def __getitem__(self, name: str) -> str:
        return _load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_load())

    def __len__(self) -> int:
        return len(_load())


queries = _Queries()
