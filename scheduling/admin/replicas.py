"""The replicas' admin: each beat replica as it last reported itself, live, stale or stopped."""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib import admin
from django.db.models import F, QuerySet
from django.http import HttpRequest
from django.templatetags.static import static
from django.utils.html import format_html

from scheduling import cadences, replicas
from scheduling.admin.base import ADMIN_CSS, ReadOnlyAdmin
from scheduling.models import Replica
from scheduling.timeformat import utc_text

REPLICA_COLOURS = {
    "live": ("#d7efd8", "#1b4d1e"), "stale": ("#fde3c0", "#6b3a00"),
    "stopped": ("#e4e7ea", "#33393f"),
}


@admin.register(Replica)
class ReplicaAdmin(ReadOnlyAdmin):
    """Beat replicas as their heartbeats report them (display only); stale ones flagged."""

    list_display = (
        "id", "host", "pid", "display_started", "display_last_tick", "runs_claimed",
        "display_state",
    )
    search_fields = ("id", "host")
    #: The detail page: the times in the one format (``utc_text``), not Django's localised one.
    fields = (
        "id", "host", "pid", "display_started", "display_last_tick", "display_stopped",
        "runs_claimed", "display_state",
    )

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": (ADMIN_CSS,)}
    # Running replicas first (stale ones sink below live ones), then the stopped ones.
    ordering = (F("stopped_at").desc(nulls_first=True), "-last_tick_at", "id")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Replica]:
        return replicas.with_state(super().get_queryset(request))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        extra = {
            "title": "Beat replicas",
            "heartbeat_interval": cadences.HEARTBEAT_INTERVAL,
            "stale_after": replicas.stale_after().total_seconds(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    @admin.display(description="started (UTC)", ordering="started_at")
    def display_started(self, replica: Replica) -> str:
        return utc_text(replica.started_at, "s")

    @admin.display(description="last tick (UTC)", ordering="-last_tick_at")
    def display_last_tick(self, replica: Any) -> str:
        return format_html(
            '<span class="one-line">{}</span> <span class="quiet one-line">({} s ago)</span>',
            utc_text(replica.last_tick_at, "s"), f"{replica.tick_age:.0f}",
        )

    @admin.display(description="stopped (UTC)", ordering="stopped_at")
    def display_stopped(self, replica: Replica) -> str:
        return utc_text(replica.stopped_at, "s")

    @admin.display(description="state")
    def display_state(self, replica: Any) -> str:
        icon = {"live": "icon-yes.svg", "stale": "icon-alert.svg", "stopped": "icon-no.svg"}
        text = {
            "live": "live",
            "stale": f"stale: no tick for {replica.tick_age:.0f} s",
            "stopped": f"stopped {utc_text(replica.stopped_at, 's')}" if replica.stopped_at
            else "stopped",
        }
        return format_html(
            '<span class="replica-state replica-{} run-badge" style="background:{};color:{}">'
            '<img src="{}" alt="{}"> {}</span>',
            replica.state, *REPLICA_COLOURS[replica.state],
            static(f"admin/img/{icon[replica.state]}"), replica.state, text[replica.state],
        )
