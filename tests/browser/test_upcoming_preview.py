"""The periodic task form's preview of upcoming runs in a real browser (Debian's chromium).

An interval task is edited to a Europe/Berlin crontab without saving; the "Preview the edited
schedule" button shows that crontab's next 10 slots from 2027-03-25, the spring-forward day
(2027-03-28, 03:00 CEST = 01:00 UTC) marked, and the task is still on its interval afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

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
    page.fill("#upcoming-from", "2027-03-25T00:00:00")
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
        ("3", "2027-03-27 01:30:00", "2027-03-27 02:30:00 CET"),
        ("4", "2027-03-28 01:00:00", "2027-03-28 03:00:00 CEST"),
        ("5", "2027-03-29 00:30:00", "2027-03-29 02:30:00 CEST"),
        ("6", "2027-03-30 00:30:00", "2027-03-30 02:30:00 CEST"),
    ]
    assert len(cells) == 10
    dst = "4\t2027-03-28 01:00:00\t2027-03-28 03:00:00 CEST\t+02:00\t"
    assert page.locator("#upcoming-preview tr.dst-change").all_inner_texts() == [
        f"{dst}DST change: UTC offset +01:00 -> +02:00"
    ]
    assert page.locator("#upcoming-preview .upcoming-about").inner_text() == (
        "The edited schedule, if saved now, after 2027-03-25 00:00:00 UTC:"
    )
    assert page.url.endswith(f"/periodictask/{task.pk}/change/")  # the form was not submitted
