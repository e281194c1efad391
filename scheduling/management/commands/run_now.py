"""``manage.py run_now <task> [--requested-by WHO] [--force]``: one manual run, dispatched once."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling import ledger
from scheduling.exceptions import RunNowRefused
from scheduling.management.commands._tasks import periodic_task


class Command(BaseCommand):
    help = (
        "Create a manual run of a periodic task (by name or id), due now; a beat replica "
        "dispatches it exactly once. The schedule is not moved. A disabled or finished task "
        "(expired, clocked time passed, one-off done) needs --force."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", help="periodic task name, or its id")
        parser.add_argument(
            "--requested-by",
            default=None,
            help="who asks, recorded on the run (default: command:<OS user>)",
        )
        parser.add_argument(
            "--force", action="store_true",
            help="run a disabled or finished task anyway (once; it stays disabled)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        task = periodic_task(options["task"])
        who = options["requested_by"] or f"command:{getpass.getuser()}"
        try:
            run = ledger.request_run(task, requested_by=who, force=options["force"])
        except RunNowRefused as exc:
            raise CommandError(f"not queued: {exc}; pass --force to run it anyway") from exc
        self.stdout.write(
            f"manual run {run.pk} of {task.name!r} queued (Celery task id {run.task_id}), "
            f"requested by {who}"
        )
