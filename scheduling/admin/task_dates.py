"""django-celery-beat's date-time fields on the periodic task page, shown read-only in the one
format of every page (``timeformat.utc_text``: ``2026-12-07 13:43:58 UTC``), not Django's
localised ``Dec. 7, 2026, 1:43 p.m.``.

``last_run_at`` and ``date_changed`` are always read-only; ``start_time`` and ``expires`` are
inputs with Django's widgets, and read-only (so shown this way) to a user who may only view.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.text import capfirst
from django_celery_beat.models import PeriodicTask

from scheduling.timeformat import utc_text

#: The date-time fields of a periodic task, in the order of the page.
DATES = ("start_time", "last_run_at", "date_changed", "expires")
#: Always read-only on the page.
ALWAYS_READ_ONLY = ("last_run_at", "date_changed")
PREFIX = "utc_"


def _shown(name: str) -> Any:
    label = capfirst(PeriodicTask._meta.get_field(name).verbose_name)

    @admin.display(description=label, ordering=name)
    def show(self: Any, task: PeriodicTask) -> str:
        return utc_text(getattr(task, name), "s")

    show.__name__ = PREFIX + name
    return show


class TaskDatesAdmin(admin.ModelAdmin):
    """Shows each read-only date-time field of a periodic task as UTC text with the zone."""

    utc_start_time = _shown("start_time")
    utc_last_run_at = _shown("last_run_at")
    utc_date_changed = _shown("date_changed")
    utc_expires = _shown("expires")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        names = [n for n in super().get_readonly_fields(request, obj) if n not in DATES]
        return (*names, *(PREFIX + name for name in DATES))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The fieldsets with each read-only date field swapped for its UTC display; the time
        of the last change after the last run."""
        read_only = set(ALWAYS_READ_ONLY)
        if not self.has_change_permission(request, obj):
            read_only.update(DATES)
        swapped = []
        for title, options in super().get_fieldsets(request, obj):
            fields: list[Any] = []
            for name in options.get("fields", ()):
                fields.append(PREFIX + name if name in read_only else name)
                if name == "last_run_at" and obj is not None:
                    fields.append(PREFIX + "date_changed")
            swapped.append((title, {**options, "fields": tuple(fields)}))
        return swapped
