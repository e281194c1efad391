"""``manage.py scheduling_prune --older-than 30d [--keep-last N] [--dry-run]``: delete old runs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling import ledger
from scheduling.console import progress
from scheduling.durations import parse_duration
from scheduling.timeformat import utc_text


class Command(BaseCommand):
    help = (
        "Delete finished runs (succeeded, failed, missed, skipped, cancelled, expired) that "
        "finished longer ago than --older-than, keeping the --keep-last most recent finished "
        "runs of each task. Pending, dispatched, running and retrying runs are never deleted. "
        "Deletes in short transactions of --batch-size runs, in id order."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", required=True, help="a duration: 30d, 12h, 90m, 45s, 2w"
        )
        parser.add_argument(
            "--keep-last", type=int, default=0,
            help="keep this many most recent finished runs of each task (default 0)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="report what would be deleted; delete nothing"
        )
        parser.add_argument("--batch-size", type=int, default=1000, help="runs per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["keep_last"] < 0:
            raise CommandError(f"--keep-last must be 0 or more, got {options['keep_last']}")
        if options["batch_size"] < 1:
            raise CommandError(f"--batch-size must be 1 or more, got {options['batch_size']}")
        try:
            older_than = parse_duration(options["older_than"])
            plan = ledger.prune_plan(older_than, options["keep_last"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        counts = ledger.prune_counts(plan)
        self.stdout.write(
            f"runs that finished before {utc_text(plan.cutoff)}, keeping the last "
            f"{plan.keep_last} of each task:"
        )
        if not options["dry_run"] and counts:
            with progress("pruning runs", total=sum(counts.values())) as advance:
                deleted = 0

                def show(n: int) -> None:
                    nonlocal deleted
                    deleted += n
                    advance(n, f"{deleted} deleted")

                counts = ledger.prune(plan, batch_size=options["batch_size"], progress=show)
        for status in sorted(counts):
            self.stdout.write(f"  {status:<10} {counts[status]:>9}")
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(f"{verb} {sum(counts.values())} runs")
