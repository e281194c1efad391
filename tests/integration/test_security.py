"""Security (issue 5): deploy checks, escaping in admin, permissions, no SQL built from strings."""

from __future__ import annotations

import ast
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from scheduling import ledger
from scheduling.models import Run
from tests.conftest import utc
from tests.integration.conftest import claim

ROOT = Path(__file__).resolve().parents[2]
# settings, admin pages through the test client, a linter: the same on any database or broker
pytestmark = pytest.mark.once

PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_ALLOWED_HOSTS": "scheduler.example.com",
    "DJANGO_HTTPS": "1",
    "DJANGO_HSTS_SECONDS": "31536000",
    "DJANGO_HSTS_INCLUDE_SUBDOMAINS": "1",
    "DJANGO_HSTS_PRELOAD": "1",
}


def _check_deploy(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120, check=False,
    )


def test_production_settings_pass_check_deploy_with_no_warning():
    done = _check_deploy(**PRODUCTION, DJANGO_SECRET_KEY=secrets.token_urlsafe(50))
    assert (done.returncode, done.stdout.strip()) == (
        0, "System check identified no issues (0 silenced)."
    ), done.stderr


def test_check_deploy_reports_the_demo_key_debug_and_plain_http():
    done = _check_deploy(DJANGO_DEBUG="1")  # no secret key, no HTTPS settings
    assert done.returncode == 1
    assert sorted(set(re.findall(r"\(security\.(W\d+)\)", done.stderr))) == [
        "W004",  # no HSTS
        "W008",  # no SSL redirect
        "W009",  # the demo secret key (not from the environment)
        "W012",  # session cookie not secure
        "W016",  # CSRF cookie not secure
        "W018",  # DEBUG on
    ]


_EXECUTE = {"execute", "executemany", "raw", "RawSQL", "extra"}


def _formatted_sql(node: ast.AST) -> bool:
    """Whether an expression builds a string: an f-string, ``%`` or ``+`` on strings, .format."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return True
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format" and isinstance(node.func.value, ast.Constant)
    )


def test_no_execute_gets_a_formatted_string():
    """Every execute(...) in scheduling/ and project/ gets a literal (or psycopg.sql) query."""
    found = []
    for path in sorted([*ROOT.glob("scheduling/**/*.py"), *ROOT.glob("project/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in _EXECUTE and _formatted_sql(node.args[0]):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
    # the check is live: each way of formatting is caught
    canary = ast.parse('c.execute(f"{x}"); c.execute("%s" % x); c.execute("a" + x);'
                       ' c.execute("{}".format(x)); c.execute("SELECT 1", [x])')
    calls = [n for n in ast.walk(canary) if isinstance(n, ast.Call) and n.args
             and getattr(n.func, "attr", "") == "execute"]
    assert [_formatted_sql(c.args[0]) for c in calls] == [True, True, True, True, False]


def test_no_sql_is_built_by_string_formatting(tmp_path):
    """ruff's S608 (SQL built by f-string, %, + or .format) over the app and the project."""
    ruff = [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "S608"]
    clean = subprocess.run([*ruff, "scheduling", "project"], cwd=ROOT, capture_output=True,
                           text=True, check=False)
    assert (clean.returncode, clean.stdout.strip()) == (0, "All checks passed!")
    # the rule is live: each way of formatting SQL is caught
    canary = tmp_path / "canary.py"
    canary.write_text(
        "def f(cursor, i, table):\n"
        '    cursor.execute(f"SELECT * FROM t WHERE id = {i}")\n'
        '    cursor.execute("SELECT * FROM t WHERE id = %s" % i)\n'
        '    cursor.execute("DELETE FROM t WHERE id = " + str(i))\n'
        '    cursor.execute("UPDATE {} SET a = 1".format(table))\n'
    )
    caught = subprocess.run([*ruff, str(canary)], capture_output=True, text=True, check=False)
    assert caught.stdout.count("S608") == 4


db = pytest.mark.django_db(transaction=True)
SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture
def superuser_client(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _staff(client, *codenames: str):
    user = User.objects.create_user(f"staff-{len(codenames)}", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


@db
def test_task_names_and_error_texts_are_escaped_in_admin(superuser_client, make_task, recorder):
    task = make_task(every=3600, name=SCRIPT, start_time=utc(2026, 1, 5, 10))
    run = ledger.request_run(task, requested_by="root")
    claim(recorder)
    ledger.record_finished(run.task_id, Run.Status.FAILED, error=f"ValueError('{SCRIPT}')")
    pages = {
        "ledger": reverse("admin:scheduling_run_changelist"),
        "run": reverse("admin:scheduling_run_change", args=[run.pk]),
        "tasks": reverse("admin:django_celery_beat_periodictask_changelist"),
        "task": reverse("admin:django_celery_beat_periodictask_change", args=[task.pk]),
    }
    for page, url in pages.items():
        body = superuser_client.get(url).content.decode()
        assert "<script>alert(1)" not in body, page
        assert ESCAPED in body, page
    # the error text where it is shown: the run's page and the task's recent runs
    for page in ("run", "task"):
        body = superuser_client.get(pages[page]).content.decode()
        assert f"ValueError(&#x27;{ESCAPED}&#x27;)" in body, page
    # a backfill's message names the task
    response = superuser_client.post(
        pages["tasks"],
        {"action": "backfill_tasks", "_selected_action": [task.pk], "apply": "1",
         "since": "2026-01-05 10:00:00", "until": "2026-01-05 11:00:00"},
        follow=True,
    )
    body = response.content.decode()
    assert "<script>alert(1)" not in body
    assert (
        f"Backfill of &#x27;{ESCAPED}&#x27;: 1 slots, 1 new backfill runs (0 already there)."
    ) in body


@db
def test_the_ledger_is_view_only_even_for_a_superuser(superuser_client, make_task, recorder):
    run = ledger.request_run(make_task(every=3600))
    claim(recorder)
    change = reverse("admin:scheduling_run_change", args=[run.pk])
    assert superuser_client.post(change, {"status": "succeeded"}).status_code == 403
    listing = superuser_client.get(reverse("admin:scheduling_run_changelist")).content.decode()
    assert 'value="delete_selected"' not in listing
    run.refresh_from_db()
    assert run.status == Run.Status.DISPATCHED


@db
def test_the_ledger_needs_the_view_permission(client, make_task):
    url = reverse("admin:scheduling_run_changelist")
    assert _staff(client).get(url).status_code == 403
    assert _staff(client, "view_run").get(url).status_code == 200


@db
def test_run_now_and_backfill_are_offered_and_work_with_the_change_permission(client, make_task):
    task = make_task(every=60)
    url = reverse("admin:django_celery_beat_periodictask_changelist")
    viewer = _staff(client, "view_periodictask").get(url).content.decode()
    assert 'value="run_tasks"' not in viewer and 'value="backfill_tasks"' not in viewer

    editor = _staff(client, "view_periodictask", "change_periodictask")
    listing = editor.get(url).content.decode()
    assert 'value="run_tasks"' in listing and 'value="backfill_tasks"' in listing
    editor.post(url, {"action": "run_tasks", "_selected_action": [task.pk]})
    assert list(Run.objects.filter(trigger="manual").values_list("requested_by", flat=True)) == [
        "staff-2"
    ]
