"""``manage.py scheduling_resume <task>``: end a periodic task's pause; nothing fires at once."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import ngettext

from scheduling import ledger
from scheduling.exceptions import PauseRejected
from scheduling.management.commands._tasks import periodic_task
from scheduling.timeformat import utc_text


class Command(BaseCommand):
    help = (
        "Resume a paused periodic task (by name or id): its next run is the first slot after "
        "now; the slots passed while paused stay one skipped run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", help="periodic task name, or its id")
        parser.add_argument(
            "--by", default=None, help="who resumes, recorded (default: command:<OS user>)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        task = periodic_task(options["task"])
        who = options["by"] or f"command:{getpass.getuser()}"
        try:
            done = ledger.resume(task, by=who)
        except PauseRejected as exc:
            raise CommandError(str(exc)) from exc
        skipped = done.run.slots if done.run is not None else 0
        self.stdout.write(
            f"resumed {task.name} at {utc_text(done.resumed_at)} by {who}: "
            + ngettext(
                "%(count)d slot skipped while paused", "%(count)d slots skipped while paused",
                skipped,
            ) % {"count": skipped}
        )
