"""The forms of the periodic task admin's actions: pause and backfill (with the succeeded slots
a backfill would run again)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.db.models import Count, Exists, OuterRef, QuerySet
from django_celery_beat.models import PeriodicTask

from scheduling.admin.base import _utc_ms
from scheduling.clock import database_now
from scheduling.exceptions import ScheduleError
from scheduling.ledger import slots_before_creation
from scheduling.models import Run
from scheduling.timeformat import utc_text


class PauseForm(forms.Form):
    """Why the selected tasks are paused (kept on the pause and on its skipped run)."""

    why = forms.CharField(
        label="Reason", max_length=500, widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Shown on the task's page and in the ledger.",
    )


class BackfillForm(forms.Form):
    """The past range of a backfill, in UTC: [since, until), until not after the database clock."""

    since = forms.DateTimeField(help_text="UTC, e.g. 2026-01-05 10:00:00")
    until = forms.DateTimeField(help_text="UTC, excluded; not in the future")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since is not None and until is not None and until <= since:
            self.add_error("until", "Until must be after since.")
        elif until is not None and until > (now := database_now()):
            self.add_error(
                "until", f"Until is in the future: the database clock is {_utc_ms(now)}."
            )
        return data


def _range_key(since: datetime, until: datetime) -> str:
    """The range a confirmation of a backfill that runs succeeded slots again was given for."""
    return f"{since.isoformat()}/{until.isoformat()}"


def _succeeded_slots(
    tasks: QuerySet[PeriodicTask], since: datetime, until: datetime
) -> dict[str, int]:
    """Per task name, the slots in [since, until) that a backfill runs again: the scheduled run
    of the slot succeeded and the slot has no backfill run yet (a slot that has one is left
    alone, ``ledger.backfill``). A manual run is due when it was asked for, not at a slot: it
    never counts. Tasks with none are left out. One query."""
    backfilled = Run.objects.live().filter(
        periodic_task=OuterRef("periodic_task"), trigger=Run.Trigger.BACKFILL,
        scheduled_for=OuterRef("scheduled_for"),
    )
    counts = (
        Run.objects.filter(
            periodic_task__in=tasks, status=Run.Status.SUCCEEDED,
            trigger=Run.Trigger.SCHEDULE,
            scheduled_for__gte=since, scheduled_for__lt=until,
        )
        .exclude(Exists(backfilled))
        .values("periodic_task__name")
        .annotate(slots=Count("scheduled_for", distinct=True))
    )
    return {row["periodic_task__name"]: row["slots"] for row in counts}


def _early_slots(
    tasks: QuerySet[PeriodicTask], since: datetime, until: datetime
) -> list[tuple[str, int, str]]:
    """Per task, ``(name, slots, created)``: the slots in [since, until) from before the task
    was created (``ledger.slots_before_creation``), ``created`` in UTC to the second. Tasks with
    none are left out, so is a broken schedule (the backfill reports its error)."""
    early = []
    for task in tasks:
        try:
            count, created = slots_before_creation(task, since, until)
        except ScheduleError:
            continue
        if count and created is not None:
            early.append((task.name, count, utc_text(created, "s")))
    return early


#: A replica's state as a badge: (background, text colour).
