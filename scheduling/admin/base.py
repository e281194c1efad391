"""What every admin of the app shares: the read-only audit base, the base that names the acting
user to the edit history, and the formatting of times and durations."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest
from django.utils.html import format_html

from scheduling import ledger
from scheduling.admin_permissions import DeclaredPermissionsAdmin
from scheduling.timeformat import utc_text

RECENT_RUNS = 10
RECENT_PAUSES = 5
#: Status badges, the runs list and the schedule health page (fit 1,280 px, sidebar open).
ADMIN_CSS = "scheduling/admin.css"


def _seconds(delta: timedelta | None) -> str:
    return "-" if delta is None else f"{delta.total_seconds():.3f} s"


def _cut(text: str, kind: str = "replica") -> str:
    """A replica or worker id on one line, cut with an ellipsis; the whole id in the title."""
    return format_html(
        '<span class="run-cut {}" title="{}">{}</span>', kind, text or "-", text or "-"
    )


def _utc_ms(moment: datetime | None) -> str:
    """An aware datetime as UTC to the millisecond, with the zone: ``2026-11-30 05:40:44.218 UTC``
    (``timeformat.utc_text``, the one format of every page and command)."""
    return utc_text(moment)


class ReadOnlyAdmin(DeclaredPermissionsAdmin):
    """An audit view: nothing can be added, changed or deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RecordsActorAdmin(DeclaredPermissionsAdmin):
    """Edits made on these pages are recorded in the edit history as made by the admin user.

    Each view that can write (the change form with its inlines, deletion, the list's actions and
    list edits) runs in one transaction that first names the user for the history's triggers
    (``ledger.acting``: the transaction-local setting ``scheduling.actor``).
    """

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with ledger.acting(_actor(request)):
            return super().changeform_view(request, *args, **kwargs)

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], add: bool = False,
        change: bool = False, form_url: str = "", obj: Any = None,
    ) -> Any:
        """Title and breadcrumb name the saved object, also when a save was refused: the form
        has then written the unsaved values into ``obj`` (a task's name shows its schedule)."""
        if change and obj is not None and obj.pk is not None and request.method == "POST":
            saved = type(obj)._default_manager.filter(pk=obj.pk).first()
            if saved is not None:
                context.update(original=saved, subtitle=str(saved))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with ledger.acting(_actor(request)):
            return super().delete_view(request, *args, **kwargs)

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if request.method != "POST":
            return super().changelist_view(request, *args, **kwargs)
        with ledger.acting(_actor(request)):
            return super().changelist_view(request, *args, **kwargs)


def _actor(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return user.get_username() if user is not None and user.is_authenticated else ""
