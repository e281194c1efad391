"""The periodic task form's preview of upcoming runs in a real browser (Debian's chromium).

An interval task is edited to a Europe/Berlin crontab without saving; the "Preview the edited
schedule" button shows that crontab's next 10 slots from 2027-03-25, the spring-forward day
(2027-03-28, 03:00 CEST = 01:00 UTC) marked, and the task is still on its interval afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from tests.browser.test_admin_pages import ARGS, ARTIFACTS, CHROMIUM

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def edited(live_server) -> Iterator[tuple[object, PeriodicTask, CrontabSchedule]]:
    """A logged-in chromium page, an interval task, and a Berlin crontab row to switch it to."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pw")
    every, _ = IntervalSchedule.objects.get_or_create(every=60, period=IntervalSchedule.SECONDS)
    task = PeriodicTask.objects.create(name="nightly export", task="project.tasks.record",
                                       interval=every)
    berlin = CrontabSchedule.objects.create(minute="30", hour="2", timezone="Europe/Berlin")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 800})
            tab.goto(f"{live_server.url}/admin/login/?next=/admin/")
            tab.fill("#id_username", "admin")
            tab.fill("#id_password", "s3cret-pw")
            tab.click("input[type=submit]")
            tab.wait_for_url(f"{live_server.url}/admin/")
            tab.goto(f"{live_server.url}/admin/django_celery_beat/periodictask/{task.pk}/change/")
            yield tab, task, berlin
        finally:
            browser.close()


def test_the_preview_shows_an_edited_crontab_before_saving(edited):
    page, task, berlin = edited
    saved = page.locator("#upcoming-saved table.upcoming-runs tbody tr")
    assert saved.count() == 10  # the interval as saved
    page.select_option("#id_interval", "")
    page.select_option("#id_crontab", str(berlin.pk))
    page.fill("#upcoming-from", "2027-03-25 00:00:00")  # as every page shows an instant
    page.click("#upcoming-preview-button")
    page.wait_for_selector("#upcoming-preview table.upcoming-runs")
    page.locator("#upcoming-preview").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "upcoming_preview.png"), full_page=True)

    rows = page.locator("#upcoming-preview tbody tr")
    cells = [
        tuple(cell.strip() for cell in row.locator("td").all_inner_texts())
        for row in rows.all()
    ]
    assert [cell[:3] for cell in cells[2:6]] == [
        ("3", "2027-03-27 01:30:00.000 UTC", "2027-03-27 02:30:00 CET"),
        ("4", "2027-03-28 01:00:00.000 UTC", "2027-03-28 03:00:00 CEST"),
        ("5", "2027-03-29 00:30:00.000 UTC", "2027-03-29 02:30:00 CEST"),
        ("6", "2027-03-30 00:30:00.000 UTC", "2027-03-30 02:30:00 CEST"),
    ]
    assert len(cells) == 10
    dst = "4\t2027-03-28 01:00:00.000 UTC\t2027-03-28 03:00:00 CEST\t+02:00\t"
    assert page.locator("#upcoming-preview tr.dst-change").all_inner_texts() == [
        f"{dst}DST change: UTC offset +01:00 -> +02:00"
    ]
    assert page.locator("#upcoming-preview .upcoming-about").inner_text() == (
        "The edited schedule, if saved now, after 2027-03-25 00:00:00 UTC:"
    )
    assert page.url.endswith(f"/periodictask/{task.pk}/change/")  # the form was not submitted


def test_the_task_page_shows_its_dates_as_every_page_does(edited, monkeypatch):
    """django-celery-beat's read-only dates in the one format, ``2026-12-07 13:43:58 UTC``, not
    Django's "Dec. 7, 2026, 1:43 p.m."; the preview's picker is a text box in the same form."""
    page, task, _ = edited
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the ORM beside playwright's loop
    PeriodicTask.objects.filter(pk=task.pk).update(
        last_run_at=datetime(2026, 12, 7, 13, 43, 58, 993954, tzinfo=UTC),
        start_time=datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
    )
    page.reload()
    page.locator(".field-utc_last_run_at").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "task_page_dates.png"), full_page=True)
    shown = {
        name: page.locator(f".field-utc_{name} .readonly").inner_text().strip()
        for name in ("last_run_at", "date_changed")
    }
    changed = PeriodicTask.objects.get(pk=task.pk).date_changed
    assert shown == {
        "last_run_at": "2026-12-07 13:43:58 UTC",
        "date_changed": f"{changed.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
    }
    assert page.locator(".field-utc_last_run_at label").inner_text() == "Last Run Datetime:"
    assert "Dec. 7, 2026" not in page.content()
    picker = page.locator("#upcoming-from")
    assert (picker.get_attribute("type"), picker.get_attribute("placeholder")) == (
        "text", "YYYY-MM-DD HH:MM:SS"
    )
