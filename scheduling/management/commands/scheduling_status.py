"""``manage.py scheduling_status [--format table|plain|json] [--upcoming N]``: tasks at a glance."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.console import Console
from rich.table import Table

from scheduling.overview import TaskStatus, task_statuses
from scheduling.timeformat import utc_text

HEADERS = (
    "Task", "Schedule", "Enabled", "Paused", "Next run", "Last run", "Outcome", "Lateness",
    "Buffered", "Overlap",
)
UPCOMING_HEADER = "Upcoming"


def cells(row: TaskStatus, upcoming: bool = False, separator: str = "\n") -> tuple[str, ...]:
    """The row's cells as text, in the order of HEADERS (then UPCOMING_HEADER if ``upcoming``).

    "Paused" is "since <UTC time> by <who>: <why>" or "-"; "Overlap" the policy in words with
    its parameter (``overview.describe_overlap``: "buffer all (limit 100)"). The upcoming slots are
    ``UpcomingRun.describe()`` lines joined by ``separator``; "-" for none, the schedule's error
    when it gives none, "none while paused" for a paused task.
    """
    paused = row.paused.describe().removeprefix("paused ") if row.paused else "-"
    main = (
        row.name,
        row.schedule,
        "yes" if row.enabled else "no",
        paused,
        utc_text(row.next_run, "s"),
        utc_text(row.last_run, "s"),
        row.last_status or "-",
        "-" if row.lateness is None else f"{row.lateness:.3f} s",
        str(row.buffered),
        row.overlap,
    )
    if not upcoming:
        return main
    if row.paused:
        return (*main, "none while paused")
    slots = separator.join(run.describe() for run in row.upcoming)
    return (*main, row.upcoming_error or slots or "-")


class Command(BaseCommand):
    help = (
        "Show every periodic task: its schedule in words, whether it is enabled, whether it is "
        "paused (since when, by whom, why), its next run (the ledger's pending run; none while "
        "paused), its last run's slot and outcome, the lateness of its last dispatched "
        "scheduled run, how many of its runs are buffered behind an unfinished one (an overlap "
        "policy that waits), and its overlap policy with its parameter (\"buffer all (limit "
        "100)\", \"replace (finish)\"); with --upcoming N, its next N slots (UTC, and in the task's own time zone). "
        "Times are UTC. On a terminal the table fits its width; piped, rows are not wrapped and "
        "lines carry no trailing spaces."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--format", choices=("table", "plain", "json"), default="table",
            help="table (rich, default), plain (tab-separated, with a header line) or json",
        )
        parser.add_argument(
            "--upcoming", type=int, default=0, metavar="N",
            help="also show each task's next N slots, from the scheduler's slot code (default 0)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        count = options["upcoming"]
        if count < 0:
            raise CommandError(f"--upcoming must be 0 or more, got {count}")
        rows = task_statuses(upcoming=count)
        shown = count > 0
        if options["format"] == "json":
            self.stdout.write(json.dumps([_json(row, shown) for row in rows], indent=2))
        elif options["format"] == "plain":
            header = (*HEADERS, UPCOMING_HEADER) if shown else HEADERS
            for line in (header, *(cells(row, shown, ", ") for row in rows)):
                self.stdout.write("\t".join(line))
        else:
            self.stdout.write(self._table(rows, shown), ending="")

    def _table(self, rows: list[TaskStatus], upcoming: bool) -> str:
        title = f"{len(rows)} periodic task{'' if len(rows) == 1 else 's'}"
        headers = (*HEADERS, UPCOMING_HEADER) if upcoming else HEADERS
        # "default" justification: the title is not padded to the table's width.
        table = Table(*headers, title=title, title_justify="default")
        for row in rows:
            dim = not row.enabled or row.paused is not None
            table.add_row(*cells(row, upcoming), style="dim" if dim else None)
        buffer = StringIO()
        if self.stdout.isatty():
            # Rich reads the terminal's width itself (the standard streams, then COLUMNS).
            console = Console(file=buffer, force_terminal=True)
        else:
            # A pipe has no width: the table at its natural width, so no row is wrapped and no
            # line is padded, without colour.
            console = Console(file=buffer, width=10_000, no_color=True)
            console.width = console.measure(table).maximum
        console.print(table)
        return buffer.getvalue()


def _json(row: TaskStatus, upcoming: bool) -> dict[str, object]:
    shown: dict[str, object] = {
        "name": row.name,
        "schedule": row.schedule,
        "enabled": row.enabled,
        "paused": row.paused.as_json() if row.paused else None,
        "next_run": row.next_run.isoformat() if row.next_run else None,
        "last_run": row.last_run.isoformat() if row.last_run else None,
        "last_status": row.last_status,
        "lateness_seconds": row.lateness,
        "buffered": row.buffered,
        "overlap": row.overlap,
    }
    if upcoming:
        shown["upcoming"] = [run.as_json() for run in row.upcoming]
        shown["upcoming_error"] = row.upcoming_error or None
    return shown
