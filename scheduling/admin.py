"""Admin: the run ledger as a read-only audit view; "Run now" and "Backfill" through the ledger."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django_celery_beat.admin import PeriodicTaskAdmin as BasePeriodicTaskAdmin
from django_celery_beat.models import PeriodicTask

from scheduling import ledger
from scheduling.exceptions import SchedulingError
from scheduling.models import Run, TaskPolicy

RECENT_RUNS = 10


def _seconds(delta: timedelta | None) -> str:
    return "-" if delta is None else f"{delta.total_seconds():.3f} s"


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """The ledger: every run, its outcome and timings; nothing can be added, changed, deleted."""

    list_display = (
        "periodic_task_name",
        "display_scheduled_for",
        "trigger",
        "status",
        "display_lateness",
        "claimed_by",
        "worker",
        "display_runtime",
        "slots",
        "executions",
        "suppressed",
    )
    list_filter = ("status", "trigger", "periodic_task_name", "claimed_by")
    date_hierarchy = "scheduled_for"
    search_fields = (
        "periodic_task_name", "task", "task_id", "reason", "error", "worker", "claimed_by"
    )
    list_select_related = False
    ordering = ("-scheduled_for", "-id")
    show_full_result_count = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in Run._meta.fields] + [
            "display_scheduled_for", "display_lateness", "display_runtime"
        ]

    @admin.display(description="scheduled for (UTC)", ordering="scheduled_for")
    def display_scheduled_for(self, run: Run) -> str:
        return run.scheduled_for.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

    @admin.display(description="lateness")
    def display_lateness(self, run: Run) -> str:
        return _seconds(run.lateness)

    @admin.display(description="runtime")
    def display_runtime(self, run: Run) -> str:
        return _seconds(run.runtime)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


admin.site.unregister(PeriodicTask)


class TaskPolicyInline(admin.StackedInline):
    """Misfire and overlap policy of one periodic task (defaults when absent)."""

    model = TaskPolicy
    can_delete = False
    max_num = 1
    extra = 0
    verbose_name = "scheduling policy"


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(BasePeriodicTaskAdmin):
    """django-celery-beat's periodic task admin, with recent runs and "Run now" via the ledger."""

    inlines = [TaskPolicyInline]
    actions = (*BasePeriodicTaskAdmin.actions, "backfill_tasks")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return (*super().get_readonly_fields(request, obj), "recent_runs")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None:
            fieldsets.append(("Recent runs", {"fields": ("recent_runs",)}))
        return fieldsets

    @admin.display(description="recent runs")
    def recent_runs(self, obj: PeriodicTask) -> str:
        runs = Run.objects.filter(periodic_task=obj).order_by("-scheduled_for", "-id")[:RECENT_RUNS]
        if not runs:
            return "No runs yet."
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    run.scheduled_for,
                    run.trigger,
                    run.status,
                    _seconds(run.lateness),
                    run.claimed_by or "-",
                    run.error or run.reason or "",
                )
                for run in runs
            ),
        )
        return format_html(
            "<table><thead><tr><th>scheduled for</th><th>trigger</th><th>status</th>"
            "<th>lateness</th><th>replica</th><th>reason / error</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            rows,
        )

    @admin.action(
        description="Run selected tasks now (once, through the ledger)", permissions=["change"]
    )
    def run_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        """Replace django-celery-beat's direct send: create one manual run per task."""
        requested_by = request.user.get_username()
        runs = [ledger.request_run(task, requested_by=requested_by) for task in queryset]
        self.message_user(
            request,
            f"{len(runs)} manual run(s) queued; a beat replica dispatches each exactly once.",
            messages.SUCCESS,
        )

    @admin.action(description="Backfill selected tasks over a past range", permissions=["change"])
    def backfill_tasks(
        self, request: HttpRequest, queryset: QuerySet[PeriodicTask]
    ) -> TemplateResponse | None:
        """Ask for a range (a form page), then create the backfill runs through the ledger."""
        form = BackfillForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            context = {
                **self.admin_site.each_context(request),
                "title": "Backfill periodic tasks",
                "form": form,
                "queryset": queryset,
                "opts": self.model._meta,
            }
            return TemplateResponse(request, "admin/scheduling/backfill.html", context)
        since, until = form.cleaned_data["since"], form.cleaned_data["until"]
        who = request.user.get_username()
        for task in queryset:
            try:
                total = ledger.backfill(task, since, until, requested_by=who)
            except SchedulingError as exc:
                self.message_user(request, f"{task.name}: {exc}", messages.ERROR)
                continue
            self.message_user(
                request,
                f"{task.name}: {total.slots} slots, {total.created} new backfill runs "
                f"({total.slots - total.created} already there).",
                messages.SUCCESS,
            )
        return None


class BackfillForm(forms.Form):
    """The past range of a backfill, in UTC: [since, until)."""

    since = forms.DateTimeField(help_text="UTC, e.g. 2026-01-05 10:00:00")
    until = forms.DateTimeField(help_text="UTC, excluded; not in the future")
