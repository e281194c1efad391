"""Pause, Resume and Run now on a periodic task's page: the list actions' rules, for one task."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from scheduling import ledger
from scheduling.models import Pause, Run

pytestmark = [pytest.mark.once, pytest.mark.django_db]


def _login(client, name: str, *codenames: str):
    user = User.objects.create_user(name, f"{name}@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def _tools(client, task) -> list[tuple[str, str]]:
    html = client.get(reverse("admin:django_celery_beat_periodictask_change", args=[task.pk]))
    return re.findall(
        r'<form method="post" action="([^"]+)" class="task-tool">.*?<button type="submit">'
        r"([^<]+)</button>",
        html.content.decode(),
    )


def test_an_editor_gets_pause_and_run_now_then_resume(client, make_task):
    task = make_task(every=60)
    _login(client, "editor", "view_periodictask", "change_periodictask")
    base = f"/admin/django_celery_beat/periodictask/{task.pk}"
    assert _tools(client, task) == [(f"{base}/pause/", "Pause"), (f"{base}/run-now/", "Run now")]
    ledger.pause(task, by="someone")
    assert _tools(client, task) == [(f"{base}/resume/", "Resume"), (f"{base}/run-now/", "Run now")]


def test_a_viewer_gets_no_button_and_a_403(client, make_task):
    task = make_task(every=60)
    _login(client, "viewer", "view_periodictask")
    assert _tools(client, task) == []
    for segment in ("pause", "resume", "run-now"):
        url = f"/admin/django_celery_beat/periodictask/{task.pk}/{segment}/"
        assert client.post(url, {"apply": "1", "why": "x", "confirm": "1"}).status_code == 403
    assert (Pause.objects.count(), Run.objects.filter(trigger="manual").count()) == (0, 0)


def test_the_tool_urls_take_only_post(client, make_task):
    task = make_task(every=60)
    _login(client, "editor", "view_periodictask", "change_periodictask")
    response = client.get(f"/admin/django_celery_beat/periodictask/{task.pk}/run-now/")
    assert (response.status_code, response["Allow"]) == (405, "POST")
    assert Run.objects.filter(trigger="manual").count() == 0


def test_run_now_of_a_disabled_task_asks_first_on_its_confirmation_page(client, make_task):
    task = make_task(every=60, name="weekly digest", enabled=False)
    _login(client, "editor", "view_periodictask", "change_periodictask")
    url = f"/admin/django_celery_beat/periodictask/{task.pk}/run-now/"
    page = client.post(url)
    assert page.status_code == 200
    assert page.templates[0].name == "admin/scheduling/run_now_confirm.html"
    html = page.content.decode()
    assert re.findall(r'<form method="post">', html) == ['<form method="post">']
    assert f'<a href="/admin/django_celery_beat/periodictask/{task.pk}/change/" ' in html
    assert "<title>Run a disabled or finished task now?" in html
    assert "<p>This task would not run on its own; a manual run runs it once" in html
    assert "these tasks" not in html.lower() and "Selected:" not in html
    assert 'value="Run it now anyway"' in html
    assert Run.objects.filter(trigger="manual").count() == 0
    done = client.post(url, {"action": "run_tasks", "confirm": "Run it now anyway"})
    assert (done.status_code, done["Location"]) == (
        302, f"/admin/django_celery_beat/periodictask/{task.pk}/change/",
    )
    manual = Run.objects.filter(periodic_task=task, trigger="manual")
    assert list(manual.values_list("requested_by", flat=True)) == ["editor"]


def test_pause_asks_why_then_pauses_this_task_only(client, make_task):
    task, other = make_task(every=60), make_task(every=60)
    _login(client, "editor", "view_periodictask", "change_periodictask")
    url = f"/admin/django_celery_beat/periodictask/{task.pk}/pause/"
    assert client.post(url).templates[0].name == "admin/scheduling/pause.html"
    assert Pause.objects.count() == 0
    done = client.post(url, {"apply": "Pause", "why": "bucket moving"})
    assert done["Location"] == f"/admin/django_celery_beat/periodictask/{task.pk}/change/"
    assert list(Pause.objects.values_list("periodic_task_id", "paused_by", "why")) == [
        (task.pk, "editor", "bucket moving"),
    ]
    assert not Pause.objects.filter(periodic_task=other).exists()
