"""``manage.py backfill <task> --since ISO --until ISO``: runs for the slots of a past range."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import ngettext
from django_celery_beat.models import PeriodicTask

from scheduling import ledger
from scheduling.console import progress
from scheduling.exceptions import SchedulingError
from scheduling.management.commands._tasks import periodic_task
from scheduling.timeformat import utc_text


def _instant(value: str) -> datetime:
    """Parse an ISO 8601 instant; a value without an offset is UTC."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise CommandError(f"not an ISO 8601 date-time: {value!r}") from exc
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Create backfill runs of a periodic task (by name or id) for every slot in "
        "[--since, --until), a past range; replicas dispatch them in slot order, subject to the "
        "task's overlap policy. Asking again for the same range creates nothing new."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", help="periodic task name, or its id")
        parser.add_argument("--since", required=True, help="first instant, ISO 8601 (UTC if naive)")
        parser.add_argument("--until", required=True, help="end (excluded), ISO 8601, not future")
        parser.add_argument("--requested-by", default=None, help="default: command:<OS user>")
        parser.add_argument(
            "--chunk", type=int, default=1000, help="slots per insert and progress step (1 or more)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["chunk"] < 1:
            raise CommandError(f"--chunk must be 1 or more, got {options['chunk']}")
        task = periodic_task(options["task"])
        since, until = _instant(options["since"]), _instant(options["until"])
        who = options["requested_by"] or f"command:{getpass.getuser()}"

        self._warn_before_creation(task, since, until)
        try:
            with progress(f"backfill {task.name}", total=100) as advance:
                done = 0.0

                def show(step: ledger.BackfillProgress) -> None:
                    nonlocal done
                    advance(100 * step.fraction - done, f"{step.slots} slots, {step.created} new")
                    done = 100 * step.fraction

                total = ledger.backfill(
                    task, since, until, requested_by=who, chunk_size=options["chunk"],
                    progress=show,
                )
        except SchedulingError as exc:
            raise CommandError(str(exc)) from exc
        if not total.slots:
            self.stderr.write(
                f"warning: backfill of {task.name!r} from {utc_text(since, 's')} until "
                f"{utc_text(until, 's')}: {ledger.no_slot_reason(task, since, until)}"
            )
            return
        counts = ", ".join((
            ngettext("%d slot", "%d slots", total.slots) % total.slots,
            ngettext("%d new run", "%d new runs", total.created) % total.created,
            f"{total.slots - total.created} already there",
        ))
        self.stdout.write(
            f"backfill of {task.name!r} from {utc_text(since, 's')} "
            f"until {utc_text(until, 's')}: {counts}"
        )

    def _warn_before_creation(self, task: PeriodicTask, since: datetime, until: datetime) -> None:
        """Say on stderr how many slots of the range come before the task was created."""
        try:
            early, created = ledger.slots_before_creation(task, since, until)
        except SchedulingError:
            return  # the backfill says what is wrong with the schedule
        if early and created is not None:
            self.stderr.write(
                ngettext(
                    "warning: %(n)d slot of this range comes before %(task)r was created "
                    "(%(created)s): it is run although the task did not exist then",
                    "warning: %(n)d slots of this range come before %(task)r was created "
                    "(%(created)s): they are run although the task did not exist then",
                    early,
                ) % {"n": early, "task": task.name,
                     "created": utc_text(created, "s")}
            )
