"""``manage.py scheduling_health``: a container probe; exit 0 when healthy, else 1 and why."""

from __future__ import annotations

import socket
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from scheduling.health import check


class Command(BaseCommand):
    help = (
        "Exit 0 when a beat replica ticked recently, no run is pending past its slot and no "
        "periodic task is overdue (runs not succeeding within its success deadline), else exit "
        "1; print one line saying why, naming the overdue tasks. For container healthchecks."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-tick-age", type=float, default=30.0,
            help="seconds since a replica's last tick (heartbeat) still counted (default 30)",
        )
        parser.add_argument(
            "--max-overdue", type=float, default=120.0,
            help="seconds a run may stay pending past its slot (default 120)",
        )
        parser.add_argument(
            "--local", action="store_true",
            help="only the replicas on this host (the container's own beat)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for option in ("max_tick_age", "max_overdue"):
            if not options[option] > 0:
                name = "--" + option.replace("_", "-")
                raise CommandError(f"{name} must be more than 0 seconds, got {options[option]:g}")
        host = socket.gethostname() if options["local"] else None
        try:
            verdict = check(options["max_tick_age"], options["max_overdue"], host=host)
        except DatabaseError as exc:
            self.stderr.write("unhealthy: cannot read the database: " + " ".join(str(exc).split()))
            sys.exit(1)
        if not verdict.healthy:
            self.stderr.write(verdict.line)
            sys.exit(1)
        self.stdout.write(verdict.line)
