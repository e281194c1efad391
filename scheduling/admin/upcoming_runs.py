"""Upcoming runs in the admin: a saved schedule's next slots, and the preview of an unsaved form's.

The slots are ``scheduling.upcoming`` (``slots.next_run`` chained); this module turns a form's
cleaned data into the periodic task it would save, renders the table
(``admin/scheduling/upcoming_runs.html``) and holds the admin mixin (a read-only field, a small
POST view, the script ``scheduling/upcoming_preview.js``). No writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.loader import render_to_string
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from scheduling.clock import database_now
from scheduling.exceptions import ScheduleError
from scheduling.timeformat import utc_text
from scheduling.upcoming import DEFAULT_COUNT, task_zone, upcoming_runs

#: The schedule fields of a periodic task: exactly one is set.
SCHEDULE_FIELDS = ("interval", "crontab", "solar", "clocked")
#: The other fields of a periodic task that decide its slots.
SLOT_FIELDS = ("start_time", "expires", "one_off", "enabled")
#: What the "Preview from" box takes, as the pages show an instant (UTC).
PREVIEW_FROM_EXAMPLE = "2026-01-05 10:00:00"
#: The fields of a crontab row.
CRONTAB_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week", "timezone")


def render(
    task: PeriodicTask, after: datetime, about: str, count: int = DEFAULT_COUNT,
    paused: str = "",
) -> str:
    """Return the HTML table of ``task``'s next ``count`` slots after ``after`` (aware).

    ``about`` is the line above the table. A schedule that gives no slot shows why (its
    ScheduleError, or an unknown crontab time zone) instead of raising. ``paused`` describes the
    task's open pause ("paused since ... by ...: why"): then no slot is listed, since none runs
    until a resume plans the first slot after it.
    """
    if paused:
        none = f"None: the task is {paused}. Resuming plans the first slot after the resume."
        return render_to_string("admin/scheduling/upcoming_runs.html", {"none": none})
    context: dict[str, Any] = {"about": about, "none": _none(task)}
    try:
        context["runs"] = upcoming_runs(task, after, count)
        context["zone"] = str(task_zone(task))
    except (ScheduleError, LookupError, ValueError) as exc:
        context["error"] = f"No upcoming runs: {exc}"
    return render_to_string("admin/scheduling/upcoming_runs.html", context)


def candidate(data: Mapping[str, Any], now: datetime) -> PeriodicTask:
    """Return the unsaved task a periodic task form's ``cleaned_data`` would save at ``now``.

    Saving sets ``date_changed`` to the moment of the save (the anchor of an interval without
    ``start_time``), so the candidate has ``now``. Raises ScheduleError unless exactly one of
    SCHEDULE_FIELDS is set.
    """
    chosen = [name for name in SCHEDULE_FIELDS if data.get(name)]
    if len(chosen) != 1:
        raise ScheduleError(
            "choose exactly one schedule (interval, crontab, solar or clocked), "
            f"not {len(chosen)}"
        )
    fields = {name: data.get(name) for name in (*SCHEDULE_FIELDS, *SLOT_FIELDS)}
    fields["one_off"] = bool(fields["one_off"])
    fields["enabled"] = bool(fields["enabled"])
    return PeriodicTask(name=data.get("name") or "", date_changed=now, **fields)


def crontab_task(crontab: CrontabSchedule, now: datetime) -> PeriodicTask:
    """Return an unsaved enabled task on ``crontab`` (saved or not), edited at ``now``.

    An unsaved crontab gets the id 0 (no row has it) so the slot code sees a crontab schedule.
    """
    if crontab.pk is None:
        crontab.pk = 0
    return PeriodicTask(name="", crontab=crontab, enabled=True, date_changed=now)


def preview_start(value: str, now: datetime) -> datetime:
    """Return the instant a preview starts from: ``value`` or ``now`` when it is empty.

    ``value`` is ``YYYY-MM-DD HH:MM:SS`` as the pages show instants (``timeformat.utc_text``,
    a trailing `` UTC`` allowed) or any ISO 8601 date-time; UTC when it names no zone. Raises
    ValueError for other text, saying what the box takes.
    """
    text = value.strip().removesuffix(" UTC").strip()
    if not text:
        return now
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        example = PREVIEW_FROM_EXAMPLE
        raise ValueError(f"Preview from: enter a date and time like {example}") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _none(task: PeriodicTask) -> str:
    if not task.enabled:
        return "None: the task is disabled."
    return "None: the schedule has no slot left (its clocked time passed, or it expired)."


class UpcomingRunsAdmin(admin.ModelAdmin):
    """A ModelAdmin base with the read-only field ``upcoming_runs`` and its preview view.

    The field shows the saved object's next slots (``saved_task``) and a "Preview the edited
    schedule" button; the script posts the unsaved form to ``<admin url>/upcoming-preview/``,
    which answers with the table for the task the form would save (``edited_task``).
    """

    class Media:
        js = ("scheduling/upcoming_preview.js",)

    def saved_task(self, obj: Any) -> PeriodicTask | None:
        """The task whose slots the saved object has, or None for an object not saved yet."""
        raise NotImplementedError

    def edited_task(self, form: forms.ModelForm, now: datetime) -> PeriodicTask:
        """The task the valid-enough ``form`` would save at ``now``; ScheduleError says why not."""
        raise NotImplementedError

    def paused(self, obj: Any) -> str:
        """The saved object's open pause in words ("paused since ... by ...: why"), or ""."""
        return ""

    def _preview_url_name(self) -> str:
        opts = self.model._meta
        return f"{opts.app_label}_{opts.model_name}_upcoming_preview"

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.upcoming_preview_view)
        preview = path("upcoming-preview/", view, name=self._preview_url_name())
        return [preview, *super().get_urls()]

    @admin.display(description="next runs")
    def upcoming_runs(self, obj: Any) -> str:
        """The saved object's next slots (UTC and its zone), then the edited schedule's preview."""
        task = self.saved_task(obj) if obj is not None and obj.pk is not None else None
        if task is None:
            saved = "Fill in the schedule and press the button to see its next runs before saving."
        else:
            saved = render(task, database_now(), "As saved:", paused=self.paused(obj))
        context = {"saved": SafeString(saved), "url": reverse(f"admin:{self._preview_url_name()}")}
        return SafeString(render_to_string("admin/scheduling/upcoming_field.html", context))

    def upcoming_preview_view(self, request: HttpRequest) -> HttpResponse:
        """POST of the unsaved form: return the HTML table of its schedule's next slots."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_add_permission(request) or self.has_change_permission(request)):
            raise PermissionDenied
        form = self.get_form(request)(request.POST)
        form.is_valid()  # errors of fields that do not decide the slots do not stop a preview
        now = database_now()
        try:
            task = self.edited_task(form, now)
            start = preview_start(request.POST.get("upcoming_from", ""), now)
        except (ScheduleError, ValueError) as exc:
            return HttpResponse(
                format_html('<p class="errornote upcoming-error">No preview: {}</p>', exc)
            )
        after = "" if start == now else f", after {utc_text(start, 's')}"
        return HttpResponse(render(task, start, f"The edited schedule, if saved now{after}:"))


def form_errors(form: forms.Form, names: tuple[str, ...], non_field: bool = False) -> None:
    """Raise ScheduleError naming the errors of ``form``'s fields ``names`` (and its own)."""
    bad = [
        f"{name}: {' '.join(form.errors[name]).rstrip('.')}" for name in names
        if name in form.errors
    ]
    if non_field:
        bad += list(form.non_field_errors())
    if bad:
        raise ScheduleError("; ".join(bad))
