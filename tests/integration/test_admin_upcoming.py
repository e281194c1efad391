"""Upcoming runs in the admin: on a task's page, and the preview of an unsaved form's schedule.

The rows are the slots of ``scheduling.upcoming`` (``slots.next_run`` chained), shown in UTC and
in the task's zone; a crontab in Europe/Berlin across the spring-forward of 2027-03-28 shows the
day it runs at the transition instant, 03:00 CEST, with the offset change named.
"""

from __future__ import annotations

import re
from datetime import UTC

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django_celery_beat.models import CrontabSchedule

from scheduling import ledger
from tests.conftest import utc

pytestmark = pytest.mark.django_db(transaction=True)

PREVIEW = "admin:django_celery_beat_periodictask_upcoming_preview"
ROW = re.compile(
    r"<tr(?: class=\"dst-change\")?><td>(\d+)</td><td>([^<]*)</td>(?:<td>([^<]*)</td>"
    r"<td>([^<]*)</td>)?<td>(?:<strong>)?([^<]*)(?:</strong>)?</td></tr>"
)
#: 2027-03-25 to 2027-04-03 of "30 2 * * *" in Europe/Berlin: (UTC, local, offset, note).
BERLIN_ROWS = [
    ("2027-03-25 01:30:00.000 UTC", "2027-03-25 02:30:00 CET", "+01:00", ""),
    ("2027-03-26 01:30:00.000 UTC", "2027-03-26 02:30:00 CET", "+01:00", ""),
    ("2027-03-27 01:30:00.000 UTC", "2027-03-27 02:30:00 CET", "+01:00", ""),
    ("2027-03-28 01:00:00.000 UTC", "2027-03-28 03:00:00 CEST", "+02:00",
     "DST change: UTC offset +01:00 -&gt; +02:00"),
    *(
        (f"2027-{day} 00:30:00.000 UTC", f"2027-{day} 02:30:00 CEST", "+02:00", "")
        for day in ("03-29", "03-30", "03-31", "04-01", "04-02", "04-03")
    ),
]


@pytest.fixture
def admin_client_(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _rows(html: str) -> list[tuple[str, ...]]:
    rows = ROW.findall(html)
    assert [int(row[0]) for row in rows] == list(range(1, len(rows) + 1))
    return [row[1:] for row in rows]


@pytest.fixture
def berlin():
    return CrontabSchedule.objects.create(minute="30", hour="2", timezone="Europe/Berlin")


def test_the_task_page_lists_the_next_ten_slots(admin_client_, make_task):
    task = make_task(cron="30 2 * * *", timezone="Europe/Berlin", start_time=utc(2027, 3, 25))
    page = admin_client_.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    assert "Upcoming runs" in page and "As saved:" in page
    assert _rows(page) == BERLIN_ROWS
    assert "scheduling/upcoming_preview.js" in page
    assert 'id="upcoming-preview-button"' in page


def test_a_disabled_task_page_says_there_are_none(admin_client_, make_task):
    task = make_task(every=60, enabled=False)
    page = admin_client_.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    assert _rows(page) == []
    assert '<p class="upcoming-none">None: the task is disabled.</p>' in page


def test_a_paused_task_page_lists_no_upcoming_slot_until_resumed(admin_client_, make_task):
    """Issue 33: a paused task runs no slot, so its page lists none, and says since, by, why."""
    task = make_task(cron="30 2 * * *", timezone="Europe/Berlin", start_time=utc(2027, 3, 25))
    pause = ledger.pause(task, by="alice", why="quarter close")
    url = reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    page = admin_client_.get(url).content.decode()
    since = f"{pause.paused_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
    assert _rows(page) == []
    assert (
        f'<p class="upcoming-none">None: the task is paused since {since} UTC by alice: '
        "quarter close. Resuming plans the first slot after the resume.</p>"
    ) in page
    ledger.resume(task, by="bob")
    assert _rows(admin_client_.get(url).content.decode()) == BERLIN_ROWS


def test_the_add_page_offers_the_preview(admin_client_):
    page = admin_client_.get(reverse("admin:django_celery_beat_periodictask_add")).content.decode()
    assert "Fill in the schedule and press the button" in page
    assert f'data-url="{reverse(PREVIEW)}"' in page


def test_the_preview_shows_an_unsaved_crontab_across_dst(admin_client_, make_task, berlin):
    task = make_task(every=60, name="edited")
    form = {"name": task.name, "task": task.task, "crontab": berlin.pk, "enabled": "on",
            "upcoming_from": "2027-03-25T00:00"}
    shown = admin_client_.post(reverse(PREVIEW), form).content.decode()
    assert "The edited schedule, if saved now, after 2027-03-25 00:00:00 UTC:" in shown
    assert _rows(shown) == BERLIN_ROWS
    task.refresh_from_db()
    assert (task.crontab_id, task.interval.every) == (None, 60)  # nothing was saved


def test_the_preview_of_an_interval_counts_from_the_save(admin_client_, make_task):
    task = make_task(every=90)
    form = {"interval": task.interval_id, "enabled": "on", "start_time_0": "2027-03-25",
            "start_time_1": "00:00:00", "upcoming_from": "2027-03-25T00:00:30"}
    shown = admin_client_.post(reverse(PREVIEW), form).content.decode()
    assert [row[0] for row in _rows(shown)] == [
        f"2027-03-25 00:{m:02d}:{s:02d}.000 UTC" for m, s in
        ((1, 30), (3, 0), (4, 30), (6, 0), (7, 30), (9, 0), (10, 30), (12, 0), (13, 30), (15, 0))
    ]


def test_a_utc_schedule_shows_its_slots_in_one_column(admin_client_, make_task):
    """In UTC, "in UTC" and "UTC offset" would repeat the slot and +00:00: one column."""
    task = make_task(cron="30 2 * * *", timezone="UTC", start_time=utc(2027, 3, 25))
    page = admin_client_.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    assert "<thead><tr><th>#</th><th>slot (UTC)</th><th></th></tr></thead>" in page
    assert "<tr><td>1</td><td>2027-03-25 02:30:00.000 UTC</td><td></td></tr>" in page
    assert _rows(page)[:2] == [
        ("2027-03-25 02:30:00.000 UTC", "", "", ""), ("2027-03-26 02:30:00.000 UTC", "", "", "")
    ]


@pytest.mark.parametrize(
    ("form", "shown"),
    [
        (
            {"enabled": "on"},
            "No preview: choose exactly one schedule (interval, crontab, solar or clocked), not 0",
        ),
        ({"crontab": "999999", "enabled": "on"}, "No preview: crontab: Select a valid choice."),
        ({"crontab": "{berlin}", "upcoming_from": "soon"},
         "No preview: Preview from: enter a date and time like 2026-01-05 10:00:00</p>"),
        ({"crontab": "{berlin}"}, '<p class="upcoming-none">None: the task is disabled.</p>'),
    ],
)
def test_the_preview_says_why_it_shows_nothing(admin_client_, berlin, form, shown):
    data = {k: v.format(berlin=berlin.pk) for k, v in form.items()}
    body = admin_client_.post(reverse(PREVIEW), data).content.decode()
    assert shown in body
    assert _rows(body) == []


def test_the_preview_is_a_post_for_users_who_may_edit_tasks(admin_client_, client, berlin):
    assert admin_client_.get(reverse(PREVIEW)).status_code == 405
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_periodictask"))
    client.force_login(viewer)
    assert client.post(reverse(PREVIEW), {"crontab": berlin.pk}).status_code == 403


CRONTAB_PREVIEW = "admin:django_celery_beat_crontabschedule_upcoming_preview"
CRONTAB_FORM = {"minute": "30", "hour": "2", "day_of_month": "*", "month_of_year": "*",
                "day_of_week": "*", "timezone": "Europe/Berlin"}


def test_the_crontab_page_and_its_preview(admin_client_, berlin):
    page = admin_client_.get(
        reverse("admin:django_celery_beat_crontabschedule_change", args=[berlin.pk])
    ).content.decode()
    assert "As saved:" in page and len(_rows(page)) == 10
    assert f'data-url="{reverse(CRONTAB_PREVIEW)}"' in page
    edited = {**CRONTAB_FORM, "hour": "3", "upcoming_from": "2027-03-25T00:00"}
    shown = admin_client_.post(reverse(CRONTAB_PREVIEW), edited).content.decode()
    assert [row[:2] for row in _rows(shown)[2:5]] == [
        ("2027-03-27 02:30:00.000 UTC", "2027-03-27 03:30:00 CET"),
        ("2027-03-28 01:30:00.000 UTC", "2027-03-28 03:30:00 CEST"),  # 03:30 exists: no transition
        ("2027-03-29 01:30:00.000 UTC", "2027-03-29 03:30:00 CEST"),
    ]
    same = admin_client_.post(
        reverse(CRONTAB_PREVIEW), {**CRONTAB_FORM, "upcoming_from": "2027-03-25T00:00"}
    ).content.decode()
    assert _rows(same) == BERLIN_ROWS
    berlin.refresh_from_db()
    assert berlin.hour == "2"  # nothing was saved


def test_the_crontab_preview_names_a_crontab_that_never_fires(admin_client_):
    never = {**CRONTAB_FORM, "day_of_month": "31", "month_of_year": "2"}
    shown = admin_client_.post(reverse(CRONTAB_PREVIEW), never).content.decode()
    assert shown == (
        '<p class="errornote upcoming-error">No preview: invalid crontab 30 2 31 2 *: '
        "day_of_month &#x27;31&#x27; never occurs in month_of_year &#x27;2&#x27;</p>"
    )


def test_the_crontab_previews_errors_are_one_sentence_each(admin_client_):
    bad = {**CRONTAB_FORM, "minute": "99", "hour": "abc"}
    shown = admin_client_.post(reverse(CRONTAB_PREVIEW), bad).content.decode()
    assert (
        "No preview: minute: Invalid minute &#x27;99&#x27;: use 0-59, *, lists (1,2), ranges "
        "(1-5) or steps (*/15); hour: Invalid hour &#x27;abc&#x27;: use 0-23, *, lists (1,2), "
        "ranges (1-5) or steps (*/15)</p>"
    ) in shown
