"""Issue 32: nothing in this app's admin writes for a user without the matching permission.

The actions and URLs are found by introspecting the admins registered for the models of
``django_celery_beat`` and ``scheduling`` (a new one is covered without editing this file):
each action of each admin (Django's own list, before any permission filter), posted to the
admin's list, and each named URL of each admin (list, add, change, delete, history, and every
custom one: the preview, the schedule health page). Each is tried as an anonymous user, as
staff without any scheduling permission and as staff with every view permission of the two
apps, by GET, by POST with a CSRF token and by POST without one. Every attempt must be refused
(the login page, 403, or 405; a GET by the viewer may show a page) and leave every row of every
``django_celery_beat_*`` and ``scheduling_*`` table as it was. Then a user with the permission an
action declares runs it, and rows change: the refusals are not an admin that refuses all.
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import reverse
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    PeriodicTask,
    SolarSchedule,
)
from psycopg import sql

from scheduling import ledger
from scheduling.admin_permissions import check_action_permissions, listed_actions, requiring
from scheduling.models import Replica, TaskPolicy
from tests.integration.conftest import claim

APPS = ("django_celery_beat", "scheduling")
TABLES = tuple(f"{app}_" for app in APPS)
ROLES = ("anonymous", "staff without scheduling permission", "view-only staff")
WAYS = ("GET", "POST with CSRF token", "POST without CSRF token")
#: What a refusal looks like, per role and way; a GET by the viewer may show a page (a read).
REFUSED = {
    "anonymous": {"GET": {"login"}, "POST with CSRF token": {"login"}},
    "staff without scheduling permission": {
        "GET": {"forbidden", "not allowed"}, "POST with CSRF token": {"forbidden", "not allowed"},
    },
    "view-only staff": {
        "GET": {"shown", "list error", "forbidden", "not allowed"},
        "POST with CSRF token": {"forbidden", "not allowed"},
    },
}

pytestmark = [pytest.mark.once, pytest.mark.django_db]


def _admins() -> list[admin.ModelAdmin]:
    registry = admin.site._registry  # Django's registry: every admin of the site
    return sorted(
        (ma for model, ma in registry.items() if model._meta.app_label in APPS),
        key=lambda ma: ma.opts.label,
    )


def _superuser_request() -> Any:
    request = RequestFactory().get("/admin/")
    request.user = User(is_superuser=True, is_staff=True, is_active=True)
    return request


#: (admin, action name) for every action of every admin, as Django lists them before filtering.
ACTIONS = [(ma, name) for ma in _admins() for name in listed_actions(ma)]
#: The actions a user can be given (some admin permission allows them): the positive cases.
GRANTABLE = [(ma, name) for ma, name in ACTIONS if name in ma.get_actions(_superuser_request())]
#: (admin, URL name) for every named URL of every admin.
URLS = [(ma, pattern) for ma in _admins() for pattern in ma.get_urls() if pattern.name]


def _action_id(case: tuple[admin.ModelAdmin, Any]) -> str:
    ma, what = case
    return f"{ma.opts.label}:{getattr(what, 'name', what)}"


def snapshot() -> dict[str, list[str]]:
    """Every row of every ``django_celery_beat_*`` and ``scheduling_*`` table, sorted."""
    with connection.cursor() as cursor:
        tables = [t for t in connection.introspection.table_names(cursor) if t.startswith(TABLES)]
        rows = {}
        for table in sorted(tables):
            cursor.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
            rows[table] = sorted(map(repr, cursor.fetchall()))
    return rows


def changed(before: dict[str, list[str]]) -> list[str]:
    """The tables whose rows differ from ``before``."""
    after = snapshot()
    return sorted(t for t in before.keys() | after.keys() if before.get(t) != after.get(t))


@pytest.fixture
def world(make_task) -> dict[str, Any]:
    """A row in every table the admins show: tasks enabled, disabled and paused, each schedule
    kind, a policy, runs (manual, dispatched), a replica; the edit history from the triggers."""
    now = ledger.database_now()
    enabled = make_task(every=60, start_time=now - timedelta(hours=3))
    disabled = make_task(cron="0 4 * * *", enabled=False)
    paused = make_task(every=120)
    make_task(clocked=ClockedSchedule.objects.create(clocked_time=now + timedelta(days=1)))
    SolarSchedule.objects.create(event="sunrise", latitude=52.5, longitude=13.4)
    TaskPolicy.objects.create(periodic_task=enabled, misfire_policy="skip")
    ledger.pause(paused, by="setup", why="maintenance")
    ledger.request_run(enabled, requested_by="setup")
    claim(lambda message: None)
    ledger.request_run(disabled, requested_by="setup", force=True)
    Replica.objects.create(id="host:1", host="host", pid=1, started_at=now, last_tick_at=now)
    assert CrontabSchedule.objects.count() == 1
    return {
        # every field an action's intermediate page asks for, so an action that ran went through
        "apply": "1", "confirm": "1", "post": "yes", "why": "permission test",
        "since": f"{now - timedelta(hours=2):%Y-%m-%d %H:%M:%S}",
        "until": f"{now - timedelta(hours=1):%Y-%m-%d %H:%M:%S}",
    }


def _user(name: str, permissions: list[Permission] | None) -> User | None:
    if permissions is None:
        return None
    user = User.objects.create_user(name, is_staff=True)  # no password: no hashing
    user.user_permissions.add(*permissions)
    return user


def _permissions(*actions: str) -> list[Permission]:
    """``<action>_<model>`` of every model of the two apps (auth's own rows)."""
    return list(Permission.objects.filter(
        content_type__app_label__in=APPS, codename__regex=rf"^({'|'.join(actions)})_",
    ))


def _clients() -> dict[str, Client]:
    users = {
        "anonymous": None,
        # staff that may look at users, nothing of scheduling
        "staff without scheduling permission": list(
            Permission.objects.filter(codename="view_user")
        ),
        "view-only staff": _permissions("view"),
    }
    return {role: _client(_user(f"user-{i}", perms)) for i, (role, perms) in
            enumerate(users.items())}


def _client(user: User | None) -> Client:
    """A client that checks CSRF as a browser's request is checked, with a CSRF cookie."""
    client = Client(enforce_csrf_checks=True)
    if user is not None:
        client.force_login(user)
    client.get(reverse("admin:index" if user is not None else "admin:login"))
    assert client.cookies["csrftoken"].value
    return client


def outcome(response: Any) -> str:
    """A response in words: login, csrf, forbidden, not allowed, shown, list error,
    redirected, or its status."""
    if response.status_code == 302:
        if response["Location"].startswith(reverse("admin:login")):
            return "login"
        # a list asked for with lookups it does not know (the action's fields, by GET)
        return "list error" if response["Location"].endswith("?e=1") else "redirected"
    if response.status_code == 403:
        return "csrf" if b"CSRF verification failed" in response.content else "forbidden"
    return {405: "not allowed", 200: "shown"}.get(response.status_code, str(response.status_code))


def attempt(client: Client, way: str, url: str, data: dict[str, Any]) -> str:
    """Send ``data`` to ``url`` the ``way`` named in WAYS; return ``outcome``."""
    if way == "GET":
        return outcome(client.get(url, data))
    if way == "POST with CSRF token":
        data = {**data, "csrfmiddlewaretoken": client.cookies["csrftoken"].value}
    return outcome(client.post(url, data))


def refusals(url: str, data: dict[str, Any]) -> list[tuple[str, str, str, list[str]]]:
    """Try ``url`` with ``data`` as each role, each way; return every attempt that was not
    refused or that changed a row: (role, way, outcome, changed tables)."""
    wrong = []
    for role, client in _clients().items():
        for way in WAYS:
            before = snapshot()
            got, tables = attempt(client, way, url, data), changed(before)
            if got not in REFUSED[role].get(way, {"csrf"}) or tables:
                wrong.append((role, way, got, tables))
    return wrong


def _selected(ma: admin.ModelAdmin) -> list[str]:
    return [str(pk) for pk in ma.model._default_manager.values_list("pk", flat=True)]


def test_the_introspection_finds_what_issue_32_names():
    """The lists the cases come from hold the actions and views issue 32 is about."""
    actions = {_action_id(case) for case in ACTIONS}
    urls = {_action_id(case) for case in URLS}
    periodic = "django_celery_beat.PeriodicTask:"
    assert {
        *(periodic + name for name in (
            "enable_tasks", "disable_tasks", "toggle_tasks", "run_tasks", "backfill_tasks",
            "pause_tasks", "resume_tasks", "delete_selected",
        )),
        "django_celery_beat.CrontabSchedule:delete_selected",
    } <= actions
    assert {
        "django_celery_beat.PeriodicTask:django_celery_beat_periodictask_upcoming_preview",
        "django_celery_beat.CrontabSchedule:django_celery_beat_crontabschedule_upcoming_preview",
        "scheduling.ScheduleHealth:scheduling_schedulehealth_changelist",
        "scheduling.Run:scheduling_run_change",
    } <= urls
    assert len({ma.opts.label for ma, _ in ACTIONS}) == 9


@pytest.mark.parametrize("case", ACTIONS, ids=_action_id)
def test_no_action_runs_without_its_permission(world, case):
    ma, name = case
    data = {**world, "action": name, "index": "0", "_selected_action": _selected(ma)}
    url = reverse(f"admin:{ma.opts.app_label}_{ma.opts.model_name}_changelist")
    wrong = refusals(url, data)
    assert wrong == [], "\n".join(map(repr, wrong))


@pytest.mark.parametrize("case", URLS, ids=_action_id)
def test_no_admin_url_writes_without_its_permission(world, case):
    ma, pattern = case
    first = ma.model._default_manager.order_by("pk").values_list("pk", flat=True).first()
    kwargs = {name: str(first) for name in pattern.pattern.converters}
    url = reverse(f"admin:{pattern.name}", kwargs=kwargs)
    wrong = refusals(url, world)
    assert wrong == [], "\n".join(map(repr, wrong))


@pytest.mark.parametrize("case", GRANTABLE, ids=_action_id)
def test_each_action_runs_for_a_user_with_its_permission(world, case):
    ma, name = case
    needed = listed_actions(ma)[name].allowed_permissions
    client = _client(_user("entitled", [*_permissions("view"), *_permissions(*needed)]))
    data = {**world, "action": name, "index": "0", "_selected_action": _selected(ma)}
    url = reverse(f"admin:{ma.opts.app_label}_{ma.opts.model_name}_changelist")
    before = snapshot()
    assert attempt(client, "POST with CSRF token", url, data) == "redirected"
    assert changed(before) != []
    # the same user, without a token, is refused by the CSRF check
    before = snapshot()
    assert (attempt(client, "POST without CSRF token", url, data), changed(before)) == ("csrf", [])


def test_a_post_that_names_no_action_is_answered_as_django_does(world):
    """With actions offered, choosing none gets Django's message, not a 403."""
    client = _client(_user("editor", [*_permissions("view"), *_permissions("change")]))
    url = reverse("admin:django_celery_beat_periodictask_changelist")
    data = {"action": "", "index": "0", "_selected_action": ["1"],
            "csrfmiddlewaretoken": client.cookies["csrftoken"].value}
    before = snapshot()
    response = client.post(url, data, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["No action selected."]
    assert changed(before) == []
    data["action"] = "no_such_action"
    assert (outcome(client.post(url, data)), changed(before)) == ("forbidden", [])


def test_every_action_of_this_apps_admins_declares_its_permissions():
    """System check scheduling.W002: none on this site; each kind of breach is named."""
    out = StringIO()
    call_command("check", "--tag", "admin", stdout=out)
    assert (check_action_permissions(), out.getvalue().strip()) == (
        [], "System check identified no issues (0 silenced)."
    )

    def undeclared(modeladmin, request, queryset):  # an action without permissions=
        queryset.update(enabled=False)

    periodic = admin.site.get_model_admin(PeriodicTask)
    registered = type(admin.site.get_model_admin(CrontabSchedule))
    plain = type("PlainCrontabAdmin", (admin.ModelAdmin,), {"actions": [undeclared]})
    try:
        periodic.actions = (*periodic.actions, undeclared)
        admin.site.unregister(CrontabSchedule)
        admin.site.register(CrontabSchedule, plain)
        found = sorted((w.id, w.msg) for w in check_action_permissions())
    finally:
        del periodic.actions  # back to the class's
        admin.site.unregister(CrontabSchedule)
        admin.site.register(CrontabSchedule, registered)
    assert found == [
        ("scheduling.W002", (
            "Admin action 'undeclared' of PeriodicTaskAdmin (django_celery_beat.PeriodicTask) "
            "is declared without permissions: it is offered to nobody."
        )),
        ("scheduling.W002", (
            "Admin action 'undeclared' of PlainCrontabAdmin (django_celery_beat.CrontabSchedule) "
            "is declared without permissions: Django offers it to every user who can view the "
            "list, so a view-only user can run it."
        )),
    ]
    # requiring() redeclares it with the permission it needs, its description kept
    redeclared = requiring(undeclared, "change")
    assert (redeclared.allowed_permissions, redeclared.__name__) == (("change",), "undeclared")
