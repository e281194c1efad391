"""The schedule rows' admins (crontab, interval, solar, clocked): django-celery-beat's, naming
the acting user to the edit history; the crontab form checks its fields."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.utils import timezone
from django_celery_beat.admin import ClockedScheduleAdmin as BaseClockedScheduleAdmin
from django_celery_beat.admin import CrontabScheduleAdmin as BaseCrontabScheduleAdmin
from django_celery_beat.admin import IntervalScheduleAdmin as BaseIntervalScheduleAdmin
from django_celery_beat.admin import SolarScheduleAdmin as BaseSolarScheduleAdmin
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from scheduling import (
    ledger,
    slots,
)
from scheduling.admin import upcoming_runs
from scheduling.admin.base import RecordsActorAdmin
from scheduling.exceptions import ScheduleError
from scheduling.timeformat import utc_text

#: The shortest interval a task may have (seconds): the replicas claim about twice a second
#: (``cadences.MAX_INTERVAL``), so a shorter one only piles up runs due at once.
SHORTEST_INTERVAL = 1.0


def interval_error(every: int | None, period: str | None) -> str:
    """Why an interval of ``every`` ``period`` (``"seconds"``, ...) is refused, or ""."""
    if not every or not period:
        return ""  # the fields' own errors
    if timedelta(**{period: every}).total_seconds() >= SHORTEST_INTERVAL:
        return ""
    return (
        f"An interval shorter than {SHORTEST_INTERVAL:g} second is refused: the replicas claim "
        "runs about twice a second, so it would only pile up runs due at once."
    )


class IntervalScheduleForm(forms.ModelForm):
    """An interval shorter than ``SHORTEST_INTERVAL`` is refused at input."""

    class Meta:
        model = IntervalSchedule
        fields = ("every", "period")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if error := interval_error(data.get("every"), data.get("period")):
            raise forms.ValidationError(error)
        return data


#: Each crontab field as an error names it, and the values it takes.
_CRONTAB_FIELD_HELP = {
    "minute": ("minute", "0-59"),
    "hour": ("hour", "0-23"),
    "day_of_month": ("day of the month", "1-31"),
    "month_of_year": ("month", "1-12"),
    "day_of_week": ("day of the week", "0-6 (0 is Sunday) or sun-sat"),
}


class CrontabScheduleForm(forms.ModelForm):
    """A crontab with an invalid field, or one that never fires (day 31 of February, say), is
    refused at input: each invalid field gets its own error, naming it."""

    class Meta:
        model = CrontabSchedule
        fields = upcoming_runs.CRONTAB_FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        invalid = [name for name in _CRONTAB_FIELD_HELP if not self._field_valid(name)]
        self.instance.invalid_crontab_fields = tuple(invalid)  # for "human readable"
        if invalid or not all(data.get(name) not in (None, "") for name in _CRONTAB_FIELD_HELP):
            return data
        fields = upcoming_runs.CRONTAB_FIELDS
        candidate = CrontabSchedule(**{field: data.get(field) for field in fields})
        try:
            slots.next_crontab(candidate, timezone.now())
        except ScheduleError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data

    def _field_valid(self, name: str) -> bool:
        """Check one field with the model's own validator; add its error, naming the field."""
        if name in self.errors:
            return False
        value = self.cleaned_data.get(name)
        if value in (None, ""):
            return True  # the field's own "required" error
        try:
            for validate in CrontabSchedule._meta.get_field(name).validators:
                validate(value)
        except ValidationError:
            label, allowed = _CRONTAB_FIELD_HELP[name]
            self.add_error(
                name,
                f"Invalid {label} {value!r}: use {allowed}, *, lists (1,2), ranges (1-5) or "
                "steps (*/15).",
            )
            return False
        return True


admin.site.unregister(CrontabSchedule)


@admin.register(CrontabSchedule)
class CrontabScheduleAdmin(
    RecordsActorAdmin, upcoming_runs.UpcomingRunsAdmin, BaseCrontabScheduleAdmin
):
    """django-celery-beat's crontab admin with ``CrontabScheduleForm`` and upcoming runs; edits
    name their user in the edit history."""

    form = CrontabScheduleForm
    fields = (*BaseCrontabScheduleAdmin.fields, "upcoming_runs")
    readonly_fields = (*BaseCrontabScheduleAdmin.readonly_fields, "upcoming_runs")

    def saved_task(self, obj: CrontabSchedule) -> PeriodicTask:
        return upcoming_runs.crontab_task(obj, ledger.database_now())

    @admin.display(description="human readable")
    def human_readable(self, obj: CrontabSchedule) -> str:
        """The crontab in words; nothing taken for valid while a field the form refused is in
        it (the form refused it: the error is beside the field)."""
        if getattr(obj, "invalid_crontab_fields", ()):
            return "- (correct the fields marked below)"
        return obj.human_readable

    def edited_task(self, form: forms.ModelForm, now: datetime) -> PeriodicTask:
        """The crontab as edited, for a task without a start time that uses it."""
        upcoming_runs.form_errors(form, upcoming_runs.CRONTAB_FIELDS, non_field=True)
        data = form.cleaned_data
        return upcoming_runs.crontab_task(
            CrontabSchedule(**{name: data[name] for name in upcoming_runs.CRONTAB_FIELDS}), now
        )


admin.site.unregister(IntervalSchedule)
admin.site.unregister(SolarSchedule)
admin.site.unregister(ClockedSchedule)


@admin.register(IntervalSchedule)
class IntervalScheduleAdmin(RecordsActorAdmin, BaseIntervalScheduleAdmin):
    """django-celery-beat's interval admin, refusing a sub-second interval
    (``IntervalScheduleForm``); edits name their user in the edit history."""

    form = IntervalScheduleForm


@admin.register(SolarSchedule)
class SolarScheduleAdmin(RecordsActorAdmin, BaseSolarScheduleAdmin):
    """django-celery-beat's solar admin; edits name their user in the edit history."""


@admin.register(ClockedSchedule)
class ClockedScheduleAdmin(RecordsActorAdmin, BaseClockedScheduleAdmin):
    """django-celery-beat's clocked admin, its list in the one format (``utc_text``, to the
    second, as a slot); edits name their user in the edit history."""

    list_display = ("utc_clocked_time",)

    @admin.display(description="clocked time (UTC)", ordering="clocked_time")
    def utc_clocked_time(self, clocked: ClockedSchedule) -> str:
        return utc_text(clocked.clocked_time, "s")
