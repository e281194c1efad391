"""Pause, Resume and Run now on a periodic task's page: the list's actions, for one task.

Each button posts to a URL of its own (``<id>/pause/``, ``<id>/resume/``, ``<id>/run-now/``),
which runs the list action of the same name on a queryset of that one task: the same code, the
same confirmation page (the pause asks why; a run of a disabled or finished task asks once more)
posting back to the same URL, the same messages. A user the list does not offer the action to
(``DeclaredPermissionsAdmin.get_actions``) gets no button and a 403; these URLs only take POST
(405 otherwise). When the action is done, the task's page comes back.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse

from scheduling.admin_permissions import listed_actions
from scheduling.models import Pause

#: (URL segment, list action, button label), in the order of the buttons.
TOOLS = (
    ("pause", "pause_tasks", "Pause"),
    ("resume", "resume_tasks", "Resume"),
    ("run-now", "run_tasks", "Run now"),
)


class TaskToolsAdmin(admin.ModelAdmin):
    """A periodic task admin with Pause, Resume and Run now buttons on the task's page."""

    def _tool_url_name(self, segment: str) -> str:
        opts = self.model._meta
        return f"{opts.app_label}_{opts.model_name}_{segment.replace('-', '_')}"

    def get_urls(self) -> list[URLPattern]:
        tools = [
            path(
                f"<path:object_id>/{segment}/",
                self.admin_site.admin_view(self._tool_view(action)),
                name=self._tool_url_name(segment),
            )
            for segment, action, _label in TOOLS
        ]
        return [*tools, *super().get_urls()]

    def _tool_view(self, action: str) -> Any:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            return self.task_tool_view(request, object_id, action)

        return view

    def task_tool_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Run list action ``action`` on task ``object_id``; its page back when it is done.

        405 for any method but POST, 403 when the list does not offer ``action`` to the user,
        404 for a task that does not exist. An action's own page (a form, a confirmation) is
        returned as is: it posts back here.
        """
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if action not in self.get_actions(request):
            raise PermissionDenied
        task = self.get_object(request, unquote(object_id))
        if task is None:
            raise Http404(f"no periodic task {object_id!r}")
        queryset = self.get_queryset(request).filter(pk=task.pk)
        response = listed_actions(self)[action](self, request, queryset)
        if response is not None:
            if getattr(response, "context_data", None) is not None:
                response.context_data["cancel_url"] = self._change_url(task.pk)
            return response
        return HttpResponseRedirect(self._change_url(task.pk))

    def _change_url(self, pk: Any) -> str:
        opts = self.model._meta
        return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[pk])

    def task_tools(self, request: HttpRequest, object_id: str) -> list[tuple[str, str]]:
        """The buttons the user gets on task ``object_id``'s page: ``(URL, label)``."""
        offered = self.get_actions(request)
        paused = Pause.objects.open().filter(periodic_task_id=object_id).exists()
        shown = [
            (segment, label) for segment, action, label in TOOLS
            if action in offered and segment != ("pause" if paused else "resume")
        ]
        return [
            (reverse(f"admin:{self._tool_url_name(segment)}", args=[object_id]), label)
            for segment, label in shown
        ]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        tools = self.task_tools(request, unquote(object_id)) if object_id.isdigit() else []
        return super().change_view(
            request, object_id, form_url, {**(extra_context or {}), "task_tools": tools}
        )
