"""The edit history's admin: every change of a periodic task's definition, read-only."""

from __future__ import annotations

from typing import ClassVar

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django_celery_beat.models import PeriodicTask

from scheduling import history
from scheduling.admin.base import ADMIN_CSS, ReadOnlyAdmin, _utc_ms
from scheduling.models import TaskHistory


@admin.register(TaskHistory)
class TaskHistoryAdmin(ReadOnlyAdmin):
    """The edit history: every change of a periodic task, its schedule row or its policy.

    Written by database triggers, whoever made the change (admin, ORM, raw SQL); read only.
    """

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": (ADMIN_CSS,)}

    list_display = (
        "periodic_task_name", "version", "display_changed_at", "display_who", "kind",
        "object_id", "operation", "display_changes",
    )
    list_filter = ("kind", "operation", "periodic_task_name")
    search_fields = ("periodic_task_name", "actor", "role")
    date_hierarchy = "changed_at"
    ordering = ("-changed_at", "-id")
    show_full_result_count = False
    readonly_fields = (
        "periodic_task_name", "display_task", "version", "display_changed_at", "display_who",
        "kind", "object_id", "operation", "display_changes", "display_runs",
    )
    fields = readonly_fields

    @admin.display(description="changed at (UTC)", ordering="changed_at")
    def display_changed_at(self, entry: TaskHistory) -> str:
        return _utc_ms(entry.changed_at)

    @admin.display(description="by")
    def display_who(self, entry: TaskHistory) -> str:
        return history.who(entry)

    @admin.display(description="before → after")
    def display_changes(self, entry: TaskHistory) -> str:
        return history.render_changes(entry)

    @admin.display(description="periodic task")
    def display_task(self, entry: TaskHistory) -> str:
        if not PeriodicTask.objects.filter(pk=entry.periodic_task_id).exists():
            return f"{entry.periodic_task_id} (deleted)"
        url = reverse("admin:django_celery_beat_periodictask_change",
                      args=[entry.periodic_task_id])
        return format_html('<a href="{}#history-v{}">{}</a>', url, entry.version,
                           entry.periodic_task_name)

    @admin.display(description="runs planned from this version")
    def display_runs(self, entry: TaskHistory) -> str:
        query = urlencode(
            {"periodic_task__id__exact": entry.periodic_task_id, "definition_version": entry.version}
        )
        return format_html(
            '<a href="{}?{}">the runs</a>', reverse("admin:scheduling_run_changelist"), query
        )
