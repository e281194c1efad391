"""One format for an instant shown to a person, on every page and in every command:
``2026-12-07 13:40:13.984 UTC`` (to the millisecond) or ``2026-12-07 13:43:58 UTC`` (to the
second), from ``scheduling.timeformat.utc_text`` and its template filter ``utc``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.template import Context, Template
from django.urls import reverse
from django_celery_beat.models import ClockedSchedule, PeriodicTask

from scheduling import ledger
from scheduling.admin.upcoming_runs import preview_start
from scheduling.models import Replica, Run, TaskHistory
from scheduling.timeformat import utc_text
from tests.acceptance.deployment import ROOT
from tests.acceptance.deployment import test_database_url as database_url

pytestmark = pytest.mark.django_db

MOMENT = datetime(2026, 12, 7, 13, 43, 58, 993954, tzinfo=UTC)
#: The same instant in another zone (UTC-5): shown in UTC all the same.
ELSEWHERE = MOMENT.astimezone(timezone(timedelta(hours=-5)))


def _manage(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url(),
           "CELERY_BROKER_URL": settings.CELERY_BROKER_URL}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )


def test_the_helper_shows_utc_with_the_zone_to_the_millisecond_or_second():
    assert utc_text(MOMENT) == "2026-12-07 13:43:58.993 UTC"  # truncated, as the runs list
    assert utc_text(ELSEWHERE, "s") == "2026-12-07 13:43:58 UTC"
    assert utc_text(None) == "-"
    with pytest.raises(ValueError, match="naive"):
        utc_text(datetime(2026, 12, 7, 13, 43, 58))
    with pytest.raises(ValueError, match="precision"):
        utc_text(MOMENT, "min")


def test_the_template_filter_is_the_helper():
    shown = Template('{% load scheduling_time %}{{ t|utc }} | {{ t|utc:"s" }} | {{ none|utc }}')
    assert shown.render(Context({"t": ELSEWHERE, "none": None})) == (
        "2026-12-07 13:43:58.993 UTC | 2026-12-07 13:43:58 UTC | -"
    )


def test_the_previews_picker_takes_what_the_pages_show():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    expected = datetime(2027, 3, 25, 0, 0, 0, tzinfo=UTC)
    for text in ("2027-03-25 00:00:00", "2027-03-25 00:00:00 UTC", "2027-03-25T00:00:00"):
        assert preview_start(text, now) == expected
    assert preview_start("  ", now) == now


@pytest.fixture
def task(make_task) -> PeriodicTask:
    task = make_task(every=3600, name="nightly")
    PeriodicTask.objects.filter(pk=task.pk).update(
        last_run_at=MOMENT, start_time=datetime(2026, 12, 1, 8, tzinfo=UTC),
        expires=datetime(2027, 1, 31, 23, 59, 59, 500000, tzinfo=UTC),
    )
    return PeriodicTask.objects.get(pk=task.pk)


def _readonly(page: str, field: str) -> str:
    found = re.search(
        rf'field-utc_{field}">.*?<div class="readonly">([^<]*)</div>', page, re.DOTALL
    )
    assert found, field
    return found[1]


def test_the_task_page_shows_beats_own_dates_in_the_format(admin_client, task):
    page = admin_client.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    assert _readonly(page, "last_run_at") == "2026-12-07 13:43:58 UTC"
    assert _readonly(page, "date_changed") == utc_text(task.date_changed, "s")
    assert "<label>Last Run Datetime:</label>" in page
    assert "Dec. 7, 2026" not in page and "p.m." not in page
    assert 'name="start_time_0" value="2026-12-01"' in page  # inputs keep Django's widgets
    assert 'placeholder="YYYY-MM-DD HH:MM:SS"' in page and 'type="datetime-local"' not in page


def test_a_view_only_user_sees_start_and_expiry_in_the_format(client, task):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_periodictask"))
    client.force_login(viewer)
    page = client.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    assert [_readonly(page, name) for name in ("start_time", "last_run_at", "expires")] == [
        "2026-12-01 08:00:00 UTC", "2026-12-07 13:43:58 UTC", "2027-01-31 23:59:59 UTC",
    ]
    assert "Dec. 1, 2026" not in page and "Jan. 31, 2027" not in page


def test_the_runs_list_and_replica_page_show_the_format(admin_client, task):
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task,
        scheduled_for=datetime(2026, 12, 7, 13, 40, 13, 984000, tzinfo=UTC),
        status=Run.Status.SUCCEEDED, task_id="shown-run",
    )
    runs = admin_client.get(reverse("admin:scheduling_run_changelist")).content.decode()
    assert "2026-12-07 13:40:13.984 UTC" in runs
    Replica.objects.create(
        id="replica-1", host="host", pid=1, started_at=MOMENT,
        last_tick_at=ledger.database_now(), stopped_at=MOMENT + timedelta(hours=1),
    )
    replicas = admin_client.get(reverse("admin:scheduling_replica_changelist")).content.decode()
    assert '<td class="field-display_started">2026-12-07 13:43:58 UTC</td>' in replicas
    assert "stopped 2026-12-07 14:43:58 UTC" in replicas
    detail = admin_client.get(
        reverse("admin:scheduling_replica_change", args=["replica-1"])
    ).content.decode()
    assert '<div class="readonly">2026-12-07 13:43:58 UTC</div>' in detail  # started
    assert '<div class="readonly">2026-12-07 14:43:58 UTC</div>' in detail  # stopped
    assert "Dec. 7, 2026" not in detail and "p.m." not in detail


def test_a_slot_and_an_edit_print_the_same_on_every_page(admin_client, make_task):
    """An interval slot counted from a save is not a whole second: upcoming and recent runs show
    it alike, to the millisecond; the task page's edit history as its list, to the millisecond."""
    slot = datetime(2030, 1, 7, 19, 0, 33, 585000, tzinfo=UTC)
    task = make_task(every=60, name="sub-second", start_time=slot - timedelta(seconds=60))
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=slot,
        task_id="pending-run",
    )
    page = admin_client.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    assert page.count("2030-01-07 19:00:33.585 UTC") == 2  # upcoming, recent runs
    assert "2030-01-07 19:00:33 UTC" not in page
    edited = utc_text(TaskHistory.objects.filter(periodic_task_id=task.pk).first().changed_at)
    assert f'<td class="moment">{edited}</td>' in page
    listed = admin_client.get(reverse("admin:scheduling_taskhistory_changelist")).content.decode()
    assert edited in listed


def test_the_clocked_list_and_the_task_forms_dropdown_show_the_format(admin_client):
    clocked = ClockedSchedule.objects.create(clocked_time=MOMENT)
    listed = admin_client.get(
        reverse("admin:django_celery_beat_clockedschedule_changelist")
    ).content.decode()
    assert "2026-12-07 13:43:58 UTC" in listed and "Dec. 7, 2026" not in listed
    form = admin_client.get(
        reverse("admin:django_celery_beat_periodictask_add")
    ).content.decode()
    assert f'<option value="{clocked.pk}">2026-12-07 13:43:58 UTC</option>' in form
    assert "+00:00" not in form


@pytest.mark.django_db(transaction=True)
def test_the_commands_show_the_format(make_task):
    task = make_task(every=3600, name="status shown")
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task,
        scheduled_for=datetime(2026, 12, 7, 13, 0, tzinfo=UTC),
        status=Run.Status.SUCCEEDED, task_id="status-run", finished_at=MOMENT,
    )
    status = _manage("scheduling_status", "--format", "plain")
    row = next(line for line in status.stdout.splitlines() if line.startswith("status shown"))
    assert "\t2026-12-07 13:00:00 UTC\t" in row
    paused = _manage("scheduling_pause", task.name, "--reason", "shown", "--by", "ops")
    assert re.fullmatch(
        r"paused status shown at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC by ops\n",
        paused.stdout,
    ), paused.stdout
    pruned = _manage("scheduling_prune", "--older-than", "30d", "--dry-run")
    assert re.search(
        r"finished before \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC", pruned.stdout
    ), pruned.stdout + pruned.stderr
    for output in (status.stdout, paused.stdout, pruned.stdout):
        assert not re.search(r"\d\dT\d\d:\d\d|\+00:00", output), output
