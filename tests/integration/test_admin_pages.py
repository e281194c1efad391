"""The replicas and schedule health admin pages, through Django's test client."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from scheduling import cadences
from tests.integration.conftest import GRACE
from tests.pages_seed import (
    HOURLY,
    MINUTELY,
    REPORT,
    SYNC,
    XSS_ERROR,
    seed_ledger,
    seed_replicas,
)

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]

HEALTH = reverse("admin:scheduling_schedulehealth_changelist")
REPLICAS = reverse("admin:scheduling_replica_changelist")


@pytest.fixture
def staff(client):
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


def _cells(html: str, task: str) -> dict[str, str]:
    """The numeric cells of one task's row: {"runs": "9", "failed": "1", ...}."""
    row = html.split(f'<tr class="task-row" data-task="{task}"', 1)[1].split("</tr>", 1)[0]
    return dict(re.findall(r'<td class="num (\w+)[^"]*">([^<]*)</td>', row))


def _marks(html: str, task: str) -> list[tuple[str, str, int]]:
    """(outcome, lane, runs) of each mark in one task's chart."""
    chart = html.split(f'<tbody class="task" data-task="{task}"', 1)[1].split("</tbody>", 1)[0]
    return [
        (outcome, lane, int(runs))
        for outcome, lane, runs in re.findall(
            r'<g class="mark mark-(\w+) lane-(\w+)" data-runs="(\d+)"', chart
        )
    ]


OUTCOME_CELLS = ("succeeded", "failed", "expired", "missed", "skipped", "cancelled", "running",
                 "buffered", "pending")


def test_health_page_counts_lateness_and_escaping(staff):
    seed_ledger()
    html = staff.get(HEALTH).content.decode()

    escaped_sync = "sync &lt;b&gt;orders&lt;/b&gt; &amp; invoices"
    assert SYNC == "sync <b>orders</b> & invoices"
    names = re.findall(r'<tr class="task-row" data-task="([^"]*)"', html)
    assert names == [MINUTELY, HOURLY, REPORT, escaped_sync]
    zero = dict.fromkeys(OUTCOME_CELLS, "0")
    assert _cells(html, HOURLY) == {
        **zero, "runs": "9", "succeeded": "7", "failed": "1", "running": "1",
        "p95": "0.187 s", "max": "0.250 s", "other": "0 · 0",
    }
    assert _cells(html, escaped_sync) == {
        **zero, "runs": "6", "succeeded": "2", "missed": "2", "skipped": "1", "cancelled": "1",
        "p95": "85.575 s", "max": "90.000 s", "other": "0 · 0",
    }
    assert _cells(html, REPORT) == {
        **zero, "runs": "2", "succeeded": "1", "expired": "1", "p95": "0.003 s",
        "max": "0.003 s", "other": "0 · 0",
    }
    per_outcome: dict[str, int] = {}
    for task in (HOURLY, REPORT, escaped_sync):
        for outcome, lane, runs in _marks(html, task):
            assert (lane, runs) == ("scheduled", 1)  # hours apart: one column each
            per_outcome[outcome] = per_outcome.get(outcome, 0) + 1
    assert per_outcome == {
        "succeeded": 10, "failed": 1, "running": 1, "missed": 2, "skipped": 1, "cancelled": 1,
        "expired": 1,
    }
    # Every minute for 24 h, in 15-minute columns: the failed runs are segments of their own.
    dense, cells = _marks(html, MINUTELY), _cells(html, MINUTELY)
    assert [n for o, _lane, n in dense if o == "failed"] == [1, 1, 1]
    succeeded = [n for o, _lane, n in dense if o == "succeeded"]
    assert max(succeeded) == 15 and sum(succeeded) == int(cells["succeeded"])
    assert int(cells["runs"]) == int(cells["succeeded"]) + 3
    assert 1430 - 15 <= int(cells["runs"]) <= 1430  # the window starts on a 15-minute boundary
    assert "<b>orders" not in html and "<script>window" not in html
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt; boom" in html  # the failed run's title
    assert XSS_ERROR not in html


def test_health_windows_and_a_custom_range(staff):
    seeded = seed_ledger()
    titles = {
        key: re.search(r"<h1>([^<]*)</h1>", staff.get(HEALTH, {"window": key}).content.decode())[1]
        for key in ("1h", "24h", "7d")
    }
    assert titles == {
        "1h": "Schedule health: the last hour", "24h": "Schedule health: the last 24 hours",
        "7d": "Schedule health: the last 7 days",
    }
    hour = staff.get(HEALTH, {"window": "1h"}).content.decode()
    assert _cells(hour, HOURLY)["runs"] == "1"  # the running run of 30 minutes ago
    assert 'data-step="60" data-buckets="60"' in hour
    start = seeded.now - timedelta(hours=21, minutes=30)
    start = start.replace(minute=start.minute // 10 * 10, second=0, microsecond=0)
    since = start.strftime("%Y-%m-%d %H:%M")
    until = (start + timedelta(hours=3)).strftime("%Y-%m-%d %H:%M")
    custom = staff.get(HEALTH, {"since": since, "until": until}).content.decode()
    assert f"Schedule health: {since} to {until} UTC" in custom
    assert 'data-step="120" data-buckets="90"' in custom  # 3 hours in 2-minute columns
    # 21 and 20 hours ago: missed twice; 19 hours ago: succeeded 90 s late
    assert _cells(custom, escaped(SYNC))["runs"] == "3"
    assert _cells(custom, escaped(SYNC))["max"] == "90.000 s"
    wrong = staff.get(HEALTH, {"since": until, "until": since}).content.decode()
    assert "To must be after from." in wrong
    assert "Schedule health: the last 24 hours" in wrong
    # Issue 33: both given, one not a date: that field's error, not "needs both".
    bad = staff.get(HEALTH, {"since": "yesterday", "until": until}).content.decode()
    assert "from: Enter a valid date/time." in bad and "needs both" not in bad
    alone = staff.get(HEALTH, {"until": until}).content.decode()
    assert "A custom range needs both from and to: to was given alone." in alone


def escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def test_health_page_queries_do_not_grow_with_runs(staff, django_assert_max_num_queries):
    seed_ledger()
    with django_assert_max_num_queries(12):
        assert staff.get(HEALTH).status_code == 200


def test_replicas_page_flags_stale_and_stopped(monkeypatch, staff, settings):
    # live stays live on a slow machine (180 s)
    monkeypatch.setattr(cadences, "HEARTBEAT_INTERVAL", 60)
    seed_replicas()
    html = staff.get(REPLICAS).content.decode()
    states = re.findall(
        r'<th class="field-id"><a [^>]*>([^<]+)</a></th>.*?'
        r'<td class="field-runs_claimed">(\d+)</td>.*?replica-state replica-(\w+)',
        html, re.DOTALL,
    )
    assert states == [
        ("replica-live", "7", "live"), ("replica-stale", "3", "stale"),
        ("replica-stopped", "2", "stopped"),
    ]
    age = re.search(r"stale: no tick for (\d+) s", html)
    assert age and 600 <= int(age[1]) < 780
    note = re.search(r'<p class="replica-note">(.*?)<a ', html, re.DOTALL)
    assert note and " ".join(note[1].split()) == (
        "Each beat replica writes a heartbeat every 60 s; one with no tick for 180 s is flagged"
        " stale. Heartbeats are for display and health probes only: runs are claimed through the"
        " ledger whatever this page shows. Times are UTC, from the database clock; runs claimed"
        " count since the replica started."
    )


def test_pages_need_staff_and_the_view_permission_on_runs(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(HEALTH).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    user = User.objects.get(pk=user.pk)
    client.force_login(user)
    assert client.get(HEALTH).status_code == 200
    client.logout()
    response = client.get(HEALTH)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def _admin_pages() -> list[str]:
    """Every admin page of the app and of django-celery-beat's models (whose admin it extends):
    the index, each app's index, and each model's changelist, add form and change form."""
    from django.contrib import admin
    from django.urls import NoReverseMatch

    pages = [reverse("admin:index")]
    for label in ("scheduling", "django_celery_beat"):
        pages.append(reverse("admin:app_list", args=[label]))
    for model in admin.site._registry:
        meta = model._meta
        if meta.app_label not in ("scheduling", "django_celery_beat"):
            continue
        prefix = f"admin:{meta.app_label}_{meta.model_name}"
        pages.append(reverse(f"{prefix}_changelist"))
        try:
            pages.append(reverse(f"{prefix}_add"))
        except NoReverseMatch:  # a page of its own only (schedule health)
            continue
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            pages.append(reverse(f"{prefix}_change", args=[first.pk]))
    return pages


def test_every_admin_page_of_the_app_renders_with_runs_in_the_ledger(staff, make_task):
    seed_ledger()
    seed_replicas()
    make_task(cron="0 7 * * 1-5", timezone="Europe/Berlin")  # the app's own crontab admin
    pages = _admin_pages()
    # the app's pages are all there, the schedule health page among them
    assert {HEALTH, REPLICAS, reverse("admin:scheduling_run_changelist")} <= set(pages)
    assert any(page.startswith("/admin/scheduling/run/") and page.endswith("/change/")
               for page in pages)
    statuses = {page: staff.get(page).status_code for page in pages}
    # the ledger, the replicas and the edit history are audit views, with no add form; every
    # other page renders
    audit = {
        reverse("admin:scheduling_run_add"), reverse("admin:scheduling_replica_add"),
        reverse("admin:scheduling_taskhistory_add"),
    }
    assert any(page.startswith("/admin/scheduling/taskhistory/") and page.endswith("/change/")
               for page in pages)
    assert statuses == {page: 403 if page in audit else 200 for page in pages}
    # 3 indexes; changelist and add form of 8 models, the change form of the 6 with a row; health
    assert len(pages) == 3 + 8 * 2 + 6 + 1
    assert "hourly digest" in staff.get(HEALTH).content.decode()


def test_the_edit_history_changelist_counts_entries(staff, make_task):
    from scheduling.models import TaskHistory

    for n in range(3):
        make_task(every=60, name=f"counted {n}")  # one entry each: created
    assert TaskHistory.objects.count() == 3
    html = staff.get(reverse("admin:scheduling_taskhistory_changelist")).content.decode()
    # The count's own line in the paginator (a <p> to Django 5.2, a <nav> from 6.0)
    assert re.findall(r"^\d+ edit history.*$", html, re.MULTILINE) == ["3 edit history entries"]


def test_health_pages_keep_their_window(staff):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from scheduling.timeline import TASKS_PER_PAGE

    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.HOURS)
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"task {n:03d}", task="project.tasks.record", interval=every)
        for n in range(TASKS_PER_PAGE + 1)
    )
    first = staff.get(HEALTH, {"window": "7d"}).content.decode()
    assert '<a href="?window=7d&amp;p=2">next</a>' in first
    second = staff.get(HEALTH, {"window": "7d", "p": "2"}).content.decode()
    assert re.findall(r'<tr class="task-row" data-task="([^"]*)"', second) == ["task 050"]
    assert "Schedule health: the last 7 days" in second
    custom = staff.get(
        HEALTH, {"since": "2026-01-05 10:00", "until": "2026-01-06 10:00"}
    ).content.decode()
    assert '<a href="?since=2026-01-05+10%3A00&amp;until=2026-01-06+10%3A00&amp;p=2">' in custom


TASK_LIST = reverse("admin:django_celery_beat_periodictask_changelist")


def _task_list_queries(staff) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        assert staff.get(TASK_LIST).status_code == 200
    return len(captured.captured_queries)


def test_the_task_list_shows_state_next_run_and_last_outcome_in_one_query(staff, make_task):
    """Issue 33: the status columns are subqueries of the page's query: as many queries for a
    page of 30 tasks (runs, pauses, every schedule kind) as for one task."""
    from scheduling import ledger
    from scheduling.models import Run
    from tests.conftest import utc

    first = make_task(every=60, name="a: first", start_time=utc(2100, 1, 1))
    ledger.reconcile(GRACE)
    alone = _task_list_queries(staff)
    for n in range(29):
        kind = ({"every": 60 + n}, {"cron": f"{n} * * * *"}, {"clocked": utc(2100, 1, 1, 0, n)})
        task = make_task(name=f"b: task {n:02d}", **kind[n % 3])
        Run.objects.create(
            periodic_task=task, periodic_task_name=task.name, task=task.task,
            scheduled_for=utc(2026, 1, 5, 10, n), status=Run.Status.SUCCEEDED, task_id=f"q-{n}",
        )
        if n % 4 == 0:
            ledger.pause(task, by="alice", why=f"reason {n}")
    ledger.reconcile(GRACE)
    assert _task_list_queries(staff) == alone

    html = staff.get(TASK_LIST).content.decode()
    row = html.split(">a: first</a>", 1)[1].split("</tr>", 1)[0]
    pending = Run.objects.pending().get(periodic_task=first).scheduled_for
    assert f'<td class="field-display_next_run">{pending:%Y-%m-%d %H:%M:%S} UTC</td>' in row
    assert '<span class="task-state task-enabled">enabled</span>' in row
    paused = html.split(">b: task 00</a>", 1)[1].split("</tr>", 1)[0]
    assert 'class="task-state task-paused" title="paused since ' in paused
    assert "by alice: reason 0" in paused
    assert '<td class="field-display_next_run">-</td>' in paused
    assert "succeeded</span> <span class=\"quiet\">2026-01-05 10:00:00 UTC</span>" in paused


def test_the_task_page_shows_the_overlap_parameters_right_after_the_overlap_policy(
    staff, make_task
):
    """The scheduling policy inline: buffer all's ``buffer_limit`` and replace's
    ``replace_started`` follow ``overlap_policy`` with their values and help texts, and the
    inline still offers every field of the policy, each once."""
    from scheduling.admin.periodic_tasks import TaskPolicyInline
    from scheduling.models import TaskPolicy

    task = make_task(every=60, name="replaced hourly")
    TaskPolicy.objects.create(
        periodic_task=task, overlap_policy=TaskPolicy.Overlap.REPLACE, buffer_limit=7,
        replace_started=TaskPolicy.ReplaceStarted.TERMINATE,
    )
    page = reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    html = staff.get(page).content.decode()
    named = re.findall(r'name="scheduling_policy-0-(\w+)"', html)
    fields = [name for name in named if name not in ("periodic_task", "DELETE")]
    assert TaskPolicyInline.fields is None  # the model's order
    start = fields.index("overlap_policy")
    assert fields[start:start + 3] == ["overlap_policy", "buffer_limit", "replace_started"]
    editable = {f.name for f in TaskPolicy._meta.get_fields() if getattr(f, "editable", False)}
    assert sorted(fields) == sorted(editable - {"periodic_task"})
    assert '<option value="replace" selected>' in html
    assert '<option value="terminate" selected>' in html
    assert re.search(r'name="scheduling_policy-0-buffer_limit" value="7"', html)
    helps = re.findall(
        r'<div class="help" id="id_scheduling_policy-0-(\w+)_helptext">\s*<div>([^<]*)</div>', html
    )
    start = [field for field, _ in helps].index("buffer_limit")
    assert helps[start:start + 2] == [
        ("buffer_limit", (
            "Overlap buffer all: most runs waiting at once. A slot due while this many wait is "
            "recorded skipped (buffer full)."
        )),
        ("replace_started", (
            "Overlap replace, when the unfinished run has already started: let it finish (its "
            "outcome kept) or revoke it with terminate; the new slot runs once it has ended."
        )),
    ]
