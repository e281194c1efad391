"""The edit history of periodic tasks, read for the admin: entries, a run's version, rendering.

The rows are written by database triggers (``sql/schema.sql``, ``models.TaskHistory``) and, for
pauses and resumes, by ``ledger.pausing``; this module only reads them. A run names the version
of its task's definition it was planned from (``Run.definition_version``); ``entry_for`` finds
the change that made that version.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from scheduling.models import Run, TaskHistory
from scheduling.timeformat import utc_text

#: Entries shown on a task's page (newest first); the rest are one link away.
SHOWN = 20

#: A timestamp as PostgreSQL's ``to_jsonb`` writes it: ``2026-12-07T16:01:07.123456+00:00``.
_MOMENT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d)")


def history_of(task_id: int, using: str = "default") -> QuerySet[TaskHistory]:
    """The edit history of periodic task ``task_id``, newest first (deleted tasks too): by
    version, then by entry (a pause or resume carries the version in force when it was made)."""
    return TaskHistory.objects.using(using).filter(periodic_task_id=task_id).order_by(
        "-version", "-id"
    )


def entry_for(run: Run, using: str = "default") -> TaskHistory | None:
    """The history entry of the definition version ``run`` was planned from, or None.

    None for a run planned before the history began (no version) or of a task never recorded.
    One indexed query (``scheduling_history_one_per_version``).
    """
    if run.definition_version is None or run.periodic_task_id is None:
        return None
    return (
        history_of(run.periodic_task_id, using).filter(version=run.definition_version)
        .exclude(kind=TaskHistory.Kind.PAUSE).first()
    )


def who(entry: TaskHistory) -> str:
    """Who made a change: the admin user, or the SQL role when no admin user is known."""
    return entry.actor or f"SQL role {entry.role}"


def changes(entry: TaskHistory) -> list[tuple[str, Any, Any]]:
    """The columns of a change as ``(column, before, after)``, sorted by column.

    A creation (or the recorded starting point) has ``before`` None for every column, a deletion
    ``after`` None.
    """
    before, after = entry.before or {}, entry.after or {}
    return [(key, before.get(key), after.get(key)) for key in sorted({*before, *after})]


def _value(value: Any) -> str:
    """A column's value as JSON; a moment (ISO 8601, as ``to_jsonb`` writes a timestamp) in UTC
    to the millisecond with its zone: ``2026-12-07 16:01:07.123 UTC``."""
    if value is None:
        return "-"
    if isinstance(value, str) and _MOMENT.fullmatch(value):
        return utc_text(datetime.fromisoformat(value))
    return json.dumps(value, ensure_ascii=False)


def _render_pause(entry: TaskHistory) -> SafeString:
    """A pause's entry: why; a resume's: since when it was paused, why, and the slots skipped."""
    details = entry.after or {}
    why = details.get("why") or "(no reason given)"
    if entry.operation == entry.Operation.PAUSED:
        return format_html("<div>paused: {}</div>", why)
    return format_html(
        "<div>resumed; paused since {}: {}; {} slot{} skipped</div>",
        _value(details.get("paused_at")), why, details.get("slots_skipped", 0),
        "" if details.get("slots_skipped") == 1 else "s",
    )


def render_changes(entry: TaskHistory) -> SafeString:
    """One line per changed column: ``hour: "3" → "5"`` (a whole row folded when created); for
    a pause or resume, what it says."""
    if entry.kind == entry.Kind.PAUSE:
        return _render_pause(entry)
    lines = format_html_join(
        "",
        "<div><code>{}</code>: {}</div>",
        (
            (key, f"{_value(old)} → {_value(new)}" if entry.operation == entry.Operation.CHANGED
             else _value(new if old is None else old))
            for key, old, new in changes(entry)
        ),
    )
    if entry.operation == entry.Operation.CHANGED:
        return lines
    return format_html(
        "<details><summary>{} columns</summary>{}</details>", len(changes(entry)), lines
    )


def entry_url(entry: TaskHistory) -> str:
    """The admin page of one history entry."""
    return reverse("admin:scheduling_taskhistory_change", args=[entry.pk])


def render_history(task_id: int, using: str = "default") -> SafeString:
    """The task page's table of its edit history: newest SHOWN versions, then a link to all."""
    entries = list(history_of(task_id, using)[: SHOWN + 1])
    if not entries:
        return format_html("{}", "No recorded changes.")
    rows = format_html_join(
        "",
        '<tr{}><td><a href="{}">{}</a></td><td class="moment">{}</td><td>{}</td>'
        '<td>{}</td><td style="overflow-wrap: anywhere">{}</td></tr>',
        (
            (
                "" if entry.kind == entry.Kind.PAUSE else
                format_html(' id="history-v{}"', entry.version),
                entry_url(entry), entry.version,
                utc_text(entry.changed_at), who(entry),
                entry.operation if entry.kind == entry.Kind.PAUSE
                else f"{entry.kind} {entry.object_id} {entry.operation}",
                render_changes(entry),
            )
            for entry in entries[:SHOWN]
        ),
    )
    more = ""
    if len(entries) > SHOWN:
        url = reverse("admin:scheduling_taskhistory_changelist")
        more = format_html(
            '<p><a href="{}?periodic_task_id={}">All versions</a></p>', url, task_id
        )
    return format_html(
        '<table class="task-history"><thead><tr><th>version</th><th>changed at</th>'
        "<th>by</th><th>what</th>"
        "<th>before → after</th></tr></thead><tbody>{}</tbody></table>{}",
        rows, more,
    )
