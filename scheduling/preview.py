"""Upcoming runs in the admin: a saved task's next slots, and the preview of an unsaved form's.

The slots are ``scheduling.upcoming`` (``slots.next_run`` chained); this module only turns a
periodic task form's cleaned data into the task it would save and renders the table
(``admin/scheduling/upcoming_runs.html``). No writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.template.loader import render_to_string
from django.utils.safestring import SafeString
from django_celery_beat.models import PeriodicTask

from scheduling.exceptions import ScheduleError
from scheduling.upcoming import DEFAULT_COUNT, task_zone, upcoming_runs

#: The schedule fields of a periodic task: exactly one is set.
SCHEDULE_FIELDS = ("interval", "crontab", "solar", "clocked")
#: The other fields that decide the slots.
SLOT_FIELDS = ("start_time", "expires", "one_off", "enabled")


def render(task: PeriodicTask, after: datetime, about: str, count: int = DEFAULT_COUNT) -> str:
    """Return the HTML table of ``task``'s next ``count`` slots after ``after`` (aware).

    ``about`` is the line above the table. A schedule that gives no slot shows why (its
    ScheduleError, or an unknown crontab time zone) instead of raising.
    """
    context: dict[str, Any] = {"about": about, "none": _none(task)}
    try:
        context["runs"] = upcoming_runs(task, after, count)
        context["zone"] = str(task_zone(task))
    except (ScheduleError, LookupError, ValueError) as exc:
        context["error"] = f"No upcoming runs: {exc}"
    return render_to_string("admin/scheduling/upcoming_runs.html", context)


def field(saved: str, url: str) -> SafeString:
    """Return the form's "Upcoming runs" field: ``saved`` (HTML), the preview button and box."""
    return SafeString(
        render_to_string(
            "admin/scheduling/upcoming_field.html", {"saved": SafeString(saved), "url": url}
        )
    )


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


def preview_start(value: str, now: datetime) -> datetime:
    """Return the instant a preview starts from: ``value`` (ISO 8601, UTC if naive) or ``now``.

    Raises ValueError for text that is not an ISO 8601 date-time.
    """
    if not value.strip():
        return now
    parsed = datetime.fromisoformat(value.strip())
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _none(task: PeriodicTask) -> str:
    if not task.enabled:
        return "None: the task is disabled."
    return "None: the schedule has no slot left (its clocked time passed, or it expired)."
