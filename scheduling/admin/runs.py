"""The run ledger's admin: a read-only audit view of every run."""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.html import format_html

from scheduling import (
    history,
    run_story,
)
from scheduling.admin.base import ADMIN_CSS, ReadOnlyAdmin, _cut, _seconds, _utc_ms
from scheduling.models import Run
from scheduling.outcomes import status_badge


class ReplicaFilter(admin.AllValuesFieldListFilter):
    """The runs list's "By replica" filter: runs no replica has claimed yet (``claimed_by``
    empty: pending, missed, cancelled) are offered as "not claimed", where Django's filter
    shows an empty link."""

    def choices(self, changelist: Any) -> Any:
        blank = changelist.get_query_string({self.lookup_kwarg: ""}, [self.lookup_kwarg_isnull])
        for choice in super().choices(changelist):
            if choice["query_string"] == blank:  # display "" or, with facets, " (3)"
                choice = {**choice, "display": "not claimed" + choice["display"]}
            yield choice


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    """The ledger: every run, its outcome and timings; nothing can be added, changed, deleted."""

    # Eight columns fit 1,280 px with the sidebar open: the status a badge, replica and worker
    # ids cut with an ellipsis (whole in the title), slots, executions and suppressed in one.
    list_display = (
        "periodic_task_name",
        "display_scheduled_for",
        "trigger",
        "display_status",
        "display_lateness",
        "display_replica",
        "display_runtime",
        "display_counts",
    )
    list_filter = ("status", "trigger", "periodic_task_name", ("claimed_by", ReplicaFilter))
    date_hierarchy = "scheduled_for"
    search_fields = (
        "periodic_task_name", "task", "task_id", "reason", "error", "worker", "claimed_by"
    )
    list_select_related = False
    ordering = ("-scheduled_for", "-id")
    show_full_result_count = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        names = [RAW_MOMENTS.get(field.name, field.name) for field in Run._meta.fields]
        names[names.index("definition_version")] = "display_definition_version"
        return ["display_story", *names]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The story (timeline and figures) first, then every column of the row as stored."""
        raw = self.get_readonly_fields(request, obj)[1:]
        return [("Story", {"fields": ["display_story"]}), ("Raw fields", {"fields": raw})]

    @admin.display(description="timeline")
    def display_story(self, run: Run) -> str:
        """What happened to the run, in order, to the millisecond (``run_story``)."""
        told = run_story.story(run)
        rows = [
            {"what": m.what, "utc": m.utc(), "local": m.local(told.zone), "detail": m.detail}
            for m in told.moments
        ]
        return render_to_string("admin/scheduling/run_story.html", {
            "run": run, "story": told, "rows": rows, "zone": str(told.zone),
            "badge": status_badge(run.status),
            "lateness": f"- ({told.unmeasured})" if told.unmeasured else _seconds(told.lateness),
            "runtime": _seconds(told.runtime)
            + (f" (the last of {told.attempts} attempts)" if told.attempts > 1 else ""),
        })

    @admin.display(description="definition version")
    def display_definition_version(self, run: Run) -> str:
        """The version its task's definition had when this run was planned, linked to the change."""
        entry = history.entry_for(run)
        if entry is None:
            return "-" if run.definition_version is None else str(run.definition_version)
        return format_html(
            '<a href="{}">version {}</a>: {} {} by {} at {}',
            history.entry_url(entry), entry.version, entry.kind, entry.operation,
            history.who(entry), _utc_ms(entry.changed_at),
        )

    @admin.display(description="scheduled for (UTC)", ordering="scheduled_for")
    def display_scheduled_for(self, run: Run) -> str:
        return _utc_ms(run.scheduled_for)

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": (ADMIN_CSS,)}

    @admin.display(description="status", ordering="status")
    def display_status(self, run: Run) -> str:
        return status_badge(run.status)

    @admin.display(description="lateness")
    def display_lateness(self, run: Run) -> str:
        """The dispatch's lateness; "-" for a backfill (its slot is in the past by design)."""
        return "-" if run.trigger == Run.Trigger.BACKFILL else _seconds(run.lateness)

    @admin.display(description="replica · worker", ordering="claimed_by")
    def display_replica(self, run: Run) -> str:
        worker = _cut(run.worker, "worker") if run.worker else ""
        return format_html("{}{}", _cut(run.claimed_by), worker)

    @admin.display(description="slots · executions · duplicates dropped")
    def display_counts(self, run: Run) -> str:
        return format_html(
            '<span title="slots {} · executions {} · suppressed duplicates {}">{} · {} · {}</span>',
            run.slots, run.executions, run.suppressed, run.slots, run.executions, run.suppressed,
        )

    @admin.display(description="runtime")
    def display_runtime(self, run: Run) -> str:
        return _seconds(run.runtime)


def _raw_moment(name: str) -> Any:
    """A raw datetime column shown as the story shows it: UTC to the millisecond (Django's
    default format stops at the minute), with the column's help text under it, as Django shows
    a model field's."""
    field = Run._meta.get_field(name)

    @admin.display(description=f"{field.verbose_name} (UTC)", ordering=name)
    def show(self: RunAdmin, run: Run) -> str:
        value = getattr(run, name)
        shown = "-" if value is None else _utc_ms(value)
        if not field.help_text:
            return shown
        return format_html('{}<div class="help">{}</div>', shown, field.help_text)

    return show


#: The raw fields' datetime columns, by name, and the admin methods that show them.
RAW_MOMENTS = {
    field.name: f"raw_{field.name}"
    for field in Run._meta.fields if field.get_internal_type() == "DateTimeField"
}
for _name, _method in RAW_MOMENTS.items():
    setattr(RunAdmin, _method, _raw_moment(_name))
