"""Admin permissions: an action runs only for the users it is offered to, and only when it says
which permission it needs.

Django offers an admin action declared without ``permissions=`` to every user who can view the
list, and silently ignores a POST naming an action the user is not offered. django-celery-beat's
"Enable", "Disable" and "Toggle" selected tasks are declared so: a view-only user could disable
a task. ``DeclaredPermissionsAdmin`` (a base of every admin this app registers) offers such an
action to nobody and answers a POST naming an action the user is not offered with 403;
``requiring`` redeclares an inherited action with the permissions it needs; system check
``scheduling.W002`` names any action of this app's admins still declared without them;
``read_only`` refuses every method but GET and HEAD on a page that only shows (405), as the
history page of every ``DeclaredPermissionsAdmin`` does.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.checks import Tags, Warning, register
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed

logger = logging.getLogger(__name__)

#: The apps whose registered admins ``scheduling.W002`` checks.
CHECKED_APPS = ("scheduling", "django_celery_beat")

Action = Callable[..., Any]


def declared(action: Action) -> bool:
    """Whether an admin action names the permissions it needs (``@admin.action(permissions=)``)."""
    return bool(getattr(action, "allowed_permissions", ()))


def requiring(action: Action, *permissions: str) -> Action:
    """Return the admin action ``action`` (a function of ``(modeladmin, request, queryset)``)
    redeclared to need one of ``permissions`` (``"change"``, ``"delete"``...: each a
    ``has_<name>_permission`` of the admin), with its description kept."""

    @admin.action(description=getattr(action, "short_description", None), permissions=permissions)
    @functools.wraps(action)
    def redeclared(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: Any) -> Any:
        return action(modeladmin, request, queryset)

    return redeclared


def posted_action(request: HttpRequest) -> str:
    """The name of the action a changelist POST asks for, as Django's ``response_action`` picks
    it (the ``action`` field of the form whose button was pushed, ``index``); "" for none."""
    try:
        index = int(request.POST.get("index", 0))
    except ValueError:
        index = 0
    names = request.POST.getlist("action")
    return names[index] if 0 <= index < len(names) else ""


class DeclaredPermissionsAdmin(admin.ModelAdmin):
    """A ModelAdmin whose actions all need a declared permission, and whose changelist refuses
    (403) a POST it would otherwise ignore or run for a user not entitled to it.

    A POST to the list is let through only when it names an action the user is offered, when it
    names none while some are offered (Django then says "No action selected."), or when it saves
    ``list_editable`` fields (Django checks the change permission itself).
    """

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        """Django's actions for ``request``'s user, less those declared without permissions.

        The entries are Django's own (a tuple up to Django 6.0, an ``Action`` from 6.1) and are
        never indexed or unpacked: each is judged by its name, through ``listed_actions``.
        ``action_location`` (Django 6.1) is passed on when Django gives it.
        """
        where = {} if action_location is None else {"action_location": action_location}
        offered = super().get_actions(request, **where)
        functions = listed_actions(self)
        return {name: entry for name, entry in offered.items() if declared(functions.get(name))}

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        if request.method == "POST" and not self._post_allowed(request):
            logger.warning(
                "refused admin POST to %s by %r: action %r not offered to this user",
                request.path, request.user.get_username(), posted_action(request),
                extra={"action": "admin_refused"},
            )
            raise PermissionDenied
        return super().changelist_view(request, extra_context)

    def history_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        """Django's history page, which only shows: 405 for any method but GET and HEAD."""
        return read_only(super().history_view)(request, object_id, extra_context)

    def _post_allowed(self, request: HttpRequest) -> bool:
        if "_save" in request.POST and self.list_editable:
            return True
        name = posted_action(request)
        offered = self.get_actions(request)
        if name:
            return name in offered
        return bool(offered) and ACTION_CHECKBOX_NAME in request.POST


def read_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap an admin page that only shows: any method but GET and HEAD is answered 405."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        return view(request, *args, **kwargs)

    return wrapped


def listed_actions(modeladmin: admin.ModelAdmin) -> dict[str, Action]:
    """Every action of ``modeladmin`` by name, before any permission filter: the site-wide ones
    (``admin.site.add_action``) and its own ``actions``, named as Django names them.

    Resolved as ``ModelAdmin.get_action`` resolves a name (a callable by its ``__name__``, a
    method of the admin's class, else a site-wide action), without the action tuple Django
    6.1 deprecates.
    """
    found: dict[str, Action] = dict(modeladmin.admin_site.actions)
    for action in modeladmin.actions or ():
        if callable(action):
            found[action.__name__] = action
        elif hasattr(type(modeladmin), action):
            found[action] = getattr(type(modeladmin), action)
        else:
            try:
                found[action] = modeladmin.admin_site.get_action(action)
            except KeyError:
                continue
    return found


@register(Tags.admin)
def check_action_permissions(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """``scheduling.W002``: an action of a registered admin of ``CHECKED_APPS`` declared without
    ``permissions=`` (offered to nobody by ``DeclaredPermissionsAdmin``, to every viewer else)."""
    warnings = []
    for label in CHECKED_APPS:
        for model in apps.get_app_config(label).get_models():
            if not admin.site.is_registered(model):
                continue
            modeladmin = admin.site.get_model_admin(model)
            hidden = isinstance(modeladmin, DeclaredPermissionsAdmin)
            for name, action in listed_actions(modeladmin).items():
                if declared(action):
                    continue
                who = "it is offered to nobody" if hidden else (
                    "Django offers it to every user who can view the list, so a view-only user "
                    "can run it"
                )
                warnings.append(Warning(
                    f"Admin action {name!r} of {type(modeladmin).__name__} "
                    f"({model._meta.label}) is declared without permissions: {who}.",
                    hint=(
                        "Declare it with @admin.action(permissions=[...]), or redeclare an "
                        "inherited one with scheduling.admin_permissions.requiring(action, "
                        "'change')."
                    ),
                    obj=modeladmin, id="scheduling.W002",
                ))
    return warnings
