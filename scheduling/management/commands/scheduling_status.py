"""``manage.py scheduling_status [--format table|plain|json]``: every periodic task at a glance."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from rich.console import Console
from rich.table import Table

from scheduling.overview import TaskStatus, format_time, task_statuses

HEADERS = ("Task", "Schedule", "Enabled", "Next run", "Last run", "Outcome", "Lateness")


def cells(row: TaskStatus) -> tuple[str, ...]:
    """The row's cells as text, in the order of HEADERS."""
    return (
        row.name,
        row.schedule,
        "yes" if row.enabled else "no",
        format_time(row.next_run),
        format_time(row.last_run),
        row.last_status or "-",
        "-" if row.lateness is None else f"{row.lateness:.3f} s",
    )


class Command(BaseCommand):
    help = (
        "Show every periodic task: its schedule in words, whether it is enabled, its next run "
        "(the ledger's pending run), its last run's slot and outcome, and the lateness of its "
        "last dispatched scheduled run. Times are UTC."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--format", choices=("table", "plain", "json"), default="table",
            help="table (rich, default), plain (tab-separated, with a header line) or json",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        rows = task_statuses()
        if options["format"] == "json":
            self.stdout.write(json.dumps([_json(row) for row in rows], indent=2))
        elif options["format"] == "plain":
            for line in (HEADERS, *map(cells, rows)):
                self.stdout.write("\t".join(line))
        else:
            self.stdout.write(self._table(rows), ending="")

    def _table(self, rows: list[TaskStatus]) -> str:
        title = f"{len(rows)} periodic task{'' if len(rows) == 1 else 's'}"
        table = Table(*HEADERS, title=title, title_justify="left")
        for row in rows:
            table.add_row(*cells(row), style=None if row.enabled else "dim")
        tty = self.stdout.isatty()
        buffer = StringIO()
        width = shutil.get_terminal_size((160, 24)).columns if tty else 200
        Console(file=buffer, width=width, force_terminal=tty, no_color=not tty).print(table)
        return buffer.getvalue()


def _json(row: TaskStatus) -> dict[str, object]:
    return {
        "name": row.name,
        "schedule": row.schedule,
        "enabled": row.enabled,
        "next_run": row.next_run.isoformat() if row.next_run else None,
        "last_run": row.last_run.isoformat() if row.last_run else None,
        "last_status": row.last_status,
        "lateness_seconds": row.lateness,
    }
