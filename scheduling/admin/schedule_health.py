"""The schedule health page: the ledger per periodic task over a window of time."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, QueryDict
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from scheduling import (
    health,
    timeline,
    windows,
)
from scheduling.admin.base import ReadOnlyAdmin
from scheduling.admin_permissions import read_only
from scheduling.clock import database_now
from scheduling.conf import conf
from scheduling.models import ScheduleHealth
from scheduling.outcomes import OUTCOMES


class HealthWindowForm(forms.Form):
    """The schedule health page's window: a preset (``windows.PRESETS``) or [since, until)."""

    window = forms.ChoiceField(
        choices=[(key, label) for key, (_span, label, _last) in windows.PRESETS.items()],
        required=False,
    )
    # Labelled as the page's inputs ("from", "to"): the errors name them so.
    since = forms.DateTimeField(
        label="from", required=False, help_text="UTC, e.g. 2026-01-05 10:00"
    )
    until = forms.DateTimeField(label="to", required=False, help_text="UTC, excluded")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        given = [
            self.fields[name].label for name in ("since", "until")
            if str(self.data.get(name, "")).strip()
        ]
        if len(given) == 1:  # a value given but not valid has its own field error
            raise forms.ValidationError(
                f"A custom range needs both from and to: {given[0]} was given alone."
            )
        if since is not None and until is not None and until <= since:
            raise forms.ValidationError("To must be after from.")
        return data

    def chosen(self, now: datetime) -> windows.Window:
        """The window asked for; the default preset when the form is invalid or empty."""
        data = self.cleaned_data if self.is_valid() else {}
        if data.get("since") is not None:
            return windows.custom(data["since"], data["until"])
        return windows.preset(data.get("window") or windows.DEFAULT, now)


def _spoken(delta: timedelta | None) -> str:
    """``30 days``, ``12 hours``, ``90 minutes``, ``45 seconds`` (the largest exact unit); ""
    for None."""
    if delta is None:
        return ""
    total = int(delta.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if total % size == 0:
            count = total // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{total} second{'' if total == 1 else 's'}"


@admin.register(ScheduleHealth)
class ScheduleHealthAdmin(ReadOnlyAdmin):
    """The schedule health page: runs per periodic task over a window (view on runs)."""

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(read_only(self.changelist_view))
        return [path("", view, name="scheduling_schedulehealth_changelist")]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("scheduling.view_run")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = HealthWindowForm(request.GET)
        window = form.chosen(database_now())
        query = QueryDict(mutable=True)
        if window.key == "custom":
            query.update({"since": request.GET["since"], "until": request.GET["until"]})
        else:
            query["window"] = window.key
        context = {
            **self.admin_site.each_context(request),
            "title": f"Schedule health: {window.label}",
            "opts": self.model._meta,
            "form": form,
            "timeline": timeline.build(window, request.GET.get("p")),
            "presets": [(key, label) for key, (_span, label, _last) in windows.PRESETS.items()],
            "window_query": query.urlencode(),
            "outcomes": OUTCOMES,
            "chart_width": timeline.CHART_WIDTH,
            "overdue": health.overdue_tasks(health.CLOSED_WINDOW.total_seconds()),
            "ledger": health.ledger_size(),
            "pruning": _spoken(conf.prune_older_than),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/scheduling/schedule_health.html", context)
