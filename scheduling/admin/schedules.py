"""The schedule rows' admins (crontab, interval, solar, clocked): django-celery-beat's, naming
the acting user to the edit history; the crontab form checks its fields."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin
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


class CrontabScheduleForm(forms.ModelForm):
    """A crontab that never fires (day 31 of February, say) is refused at input."""

    class Meta:
        model = CrontabSchedule
        fields = upcoming_runs.CRONTAB_FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if all(data.get(field) not in (None, "") for field in upcoming_runs.CRONTAB_FIELDS):
            fields = upcoming_runs.CRONTAB_FIELDS
            candidate = CrontabSchedule(**{field: data[field] for field in fields})
            try:
                slots.next_crontab(candidate, timezone.now())
            except ScheduleError as exc:
                raise forms.ValidationError(str(exc)) from exc
        return data


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
    """django-celery-beat's interval admin; edits name their user in the edit history."""


@admin.register(SolarSchedule)
class SolarScheduleAdmin(RecordsActorAdmin, BaseSolarScheduleAdmin):
    """django-celery-beat's solar admin; edits name their user in the edit history."""


@admin.register(ClockedSchedule)
class ClockedScheduleAdmin(RecordsActorAdmin, BaseClockedScheduleAdmin):
    """django-celery-beat's clocked admin; edits name their user in the edit history."""
