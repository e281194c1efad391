"""The periodic task form in a real browser (Debian's chromium): the crontab's words under its
field, and a registered task kept chosen after a refused save."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django_celery_beat.models import CrontabSchedule, IntervalSchedule

from tests.browser.test_admin_pages import ARGS, ARTIFACTS, CHROMIUM

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def add_form(live_server) -> Iterator[tuple[object, IntervalSchedule, CrontabSchedule, str]]:
    """A logged-in chromium page on the periodic task add form, an interval and a crontab row
    (and its words): the database is not reached once the browser runs."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pw")
    every, _ = IntervalSchedule.objects.get_or_create(every=60, period=IntervalSchedule.SECONDS)
    crontab = CrontabSchedule.objects.create(minute="30", hour="2", timezone="UTC")
    words = crontab.human_readable
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
            tab.goto(f"{live_server.url}/admin/django_celery_beat/periodictask/add/")
            yield tab, every, crontab, words
        finally:
            browser.close()


def test_the_crontab_help_names_the_chosen_crontab_and_nothing_when_none(add_form):
    page, _, crontab, words = add_form
    help_ = page.locator(".field-crontab .help")
    original = help_.inner_text()
    page.select_option("#id_crontab", str(crontab.pk))
    assert help_.inner_text() == f"{original}\nTranslation: {words}"
    page.select_option("#id_crontab", "")
    assert help_.inner_text() == original
    assert "undefined" not in help_.inner_text()
    page.screenshot(path=str(ARTIFACTS / "task_form_crontab_help.png"), full_page=True)


def test_a_registered_task_stays_chosen_after_a_refused_save(add_form):
    page, every, crontab, _ = add_form
    page.fill("#id_name", "digest")
    page.select_option("#id_regtask", "project.tasks.send_digest")
    page.select_option("#id_interval", str(every.pk))
    page.select_option("#id_crontab", str(crontab.pk))  # two schedules: refused
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    assert "Only one of clocked, interval, crontab, or solar must be set" in page.content()
    page.screenshot(path=str(ARTIFACTS / "task_form_refused.png"), full_page=True)
    assert page.locator("#id_regtask").input_value() == "project.tasks.send_digest"
    assert page.locator("#id_task").input_value() == ""
