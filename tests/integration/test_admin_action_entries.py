"""The permission filter of this app's admins never indexes or unpacks Django's action entries.

Django 6.1 deprecates both on the action tuple (``ModelAdmin.get_action``, ``get_actions``): its
entries become ``Action`` objects that warn when indexed or unpacked. Here every entry Django
gives is an object that raises when indexed or iterated, and every deprecation warning is an
error: the filter and system check ``scheduling.W002`` must still give the exact same answers.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import RequestFactory
from django_celery_beat.models import PeriodicTask

from scheduling.admin_permissions import (
    DeclaredPermissionsAdmin,
    check_action_permissions,
    listed_actions,
)

pytestmark = pytest.mark.once


class Opaque:
    """An action entry that refuses the tuple interface (Django 6.1 warns there)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, index: Any) -> Any:
        raise AssertionError(f"action entry {self.name!r} indexed with {index!r}")

    def __iter__(self) -> Any:
        raise AssertionError(f"action entry {self.name!r} unpacked")


def _superuser_request() -> Any:
    request = RequestFactory().get("/admin/")
    request.user = User(is_superuser=True, is_staff=True, is_active=True)
    return request


@pytest.fixture
def opaque_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Django's ``get_actions`` gives opaque entries; ``get_action``, which returns the tuple,
    may be called by Django's own code only."""
    django_get_actions = admin.ModelAdmin.get_actions
    django_get_action = admin.ModelAdmin.get_action

    def get_actions(self: admin.ModelAdmin, request: Any, **kwargs: Any) -> dict[str, Opaque]:
        return {name: Opaque(name) for name in django_get_actions(self, request)}

    def get_action(self: admin.ModelAdmin, action: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals["__name__"]
        if caller.startswith("scheduling"):
            raise AssertionError(f"{caller} called ModelAdmin.get_action({action!r}): a tuple")
        return django_get_action(self, action, *args, **kwargs)  # Django 6.1: action_location

    monkeypatch.setattr(admin.ModelAdmin, "get_actions", get_actions)
    monkeypatch.setattr(admin.ModelAdmin, "get_action", get_action)


def test_periodic_task_actions_filtered_without_touching_entries(opaque_entries: None) -> None:
    modeladmin = admin.site.get_model_admin(PeriodicTask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        offered = modeladmin.get_actions(_superuser_request())
        listed = listed_actions(modeladmin)
        found = check_action_permissions()
    assert sorted(offered) == [
        "backfill_tasks", "delete_selected", "disable_tasks", "enable_tasks", "pause_tasks",
        "resume_tasks", "run_tasks", "toggle_tasks",
    ]
    assert all(isinstance(entry, Opaque) for entry in offered.values())
    assert listed["run_tasks"] is type(modeladmin).run_tasks
    assert listed["delete_selected"] is admin.site.get_action("delete_selected")
    assert [w.id for w in found] == []


def test_get_actions_takes_django_61_action_location() -> None:
    """Django 6.1 passes ``action_location`` to an override that names it (else it warns)."""
    parameters = inspect.signature(DeclaredPermissionsAdmin.get_actions).parameters
    assert list(parameters) == ["self", "request", "action_location"]
    assert parameters["action_location"].default is None
