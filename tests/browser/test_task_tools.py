"""Pause, Resume and Run now on a periodic task's page, in a real browser (Debian's chromium) at
1,280 x 800: each button runs the list action for this task and brings its page back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from scheduling.models import Pause, Run
from tests.browser.test_admin_pages import ARGS, ARTIFACTS, CHROMIUM

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]


def _shot(page, name: str) -> None:
    page.screenshot(path=str(Path(ARTIFACTS) / f"{name}.png"), full_page=True)


def _message(page) -> str:
    return page.locator("ul.messagelist li").inner_text()


def test_pause_resume_and_run_now_from_the_task_page(live_server, make_task):
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pw")
    task = make_task(every=3600, name="nightly export")
    url = f"{live_server.url}/admin/django_celery_beat/periodictask/{task.pk}/change/"
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:  # no ORM call from here to the end of the block
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{live_server.url}/admin/login/?next={url}")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "s3cret-pw")
            page.click("input[type=submit]")
            page.wait_for_url(url)
            tools = page.locator(".object-tools form.task-tool button")
            assert tools.all_inner_texts() == ["PAUSE", "RUN NOW"]
            _shot(page, "task_tools_before")

            tools.filter(has_text="Pause").click()
            page.wait_for_selector("input[name=apply]")
            page.fill("#id_why", "migrating the export bucket")
            page.click("input[name=apply]")
            page.wait_for_url(url)
            assert _message(page) == "Paused nightly export."
            assert page.locator(".scheduling-paused").inner_text().endswith("by admin")
            assert "migrating the export bucket" in page.locator(".field-pause_state").inner_text()
            assert tools.all_inner_texts() == ["RESUME", "RUN NOW"]
            _shot(page, "task_tools_paused")

            tools.filter(has_text="Resume").click()
            page.wait_for_url(url)
            assert _message(page) == "Resumed nightly export: 0 slots skipped while paused."
            assert page.locator(".field-pause_state strong").first.inner_text() == "Not paused."
            assert tools.all_inner_texts() == ["PAUSE", "RUN NOW"]

            tools.filter(has_text="Run now").click()
            page.wait_for_url(url)
            assert _message(page) == (
                "1 manual run queued; a beat replica dispatches it exactly once."
            )
            rows = page.locator("table.recent-runs tbody tr").all_inner_texts()
            assert [row.split("\t")[1:3] for row in rows] == [
                ["schedule · 1", "pending"], ["manual · 1", "pending"],
            ]  # the next slot, planned by the resume; the manual run
            _shot(page, "task_tools_run_now")
        finally:
            browser.close()
    pause = Pause.objects.get(periodic_task=task)
    assert (pause.paused_by, pause.why, pause.resumed_by) == (
        "admin", "migrating the export bucket", "admin",
    )
    manual = Run.objects.filter(periodic_task=task, trigger=Run.Trigger.MANUAL)
    assert list(manual.values_list("requested_by", "status")) == [("admin", Run.Status.PENDING)]
