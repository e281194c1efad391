"""``manage.py scheduling_pause <task> --reason TEXT``: pause a periodic task, saying why."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling import ledger
from scheduling.exceptions import PauseRejected
from scheduling.management.commands._tasks import periodic_task
from scheduling.timeformat import utc_text


class Command(BaseCommand):
    help = (
        "Pause a periodic task (by name or id): no scheduled run is dispatched until "
        "scheduling_resume; the slots passed are recorded as one skipped run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", help="periodic task name, or its id")
        parser.add_argument("--reason", required=True, help="why, kept on the pause")
        parser.add_argument(
            "--by", default=None, help="who pauses, recorded (default: command:<OS user>)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        task = periodic_task(options["task"])
        who = options["by"] or f"command:{getpass.getuser()}"
        try:
            made = ledger.pause(task, by=who, why=options["reason"])
        except PauseRejected as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"paused {task.name} at {utc_text(made.paused_at)} by {who}")
