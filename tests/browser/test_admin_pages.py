"""The replicas and schedule health pages in a real browser: Debian's chromium via Playwright.

The ledger and replicas are seeded (tests/pages_seed.py) before the browser starts: Playwright's
sync API runs an event loop in this thread, where Django refuses ORM calls. The app is served by
pytest-django's live_server; full-page screenshots go to tests/artifacts/ (git-ignored).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

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

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture
def page(live_server, settings) -> Iterator[object]:
    """A logged-in chromium page (the superuser went through the login form).

    Heartbeats every 60 s: the live replica stays live (stale after 180 s) however slowly a
    loaded machine gets from seeding to the replicas page.
    """
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    settings.SCHEDULING_HEARTBEAT_INTERVAL = 60
    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pw")
    seed_ledger()
    seed_replicas()
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1600, "height": 900})
            tab.goto(f"{live_server.url}/admin/login/?next=/admin/")
            tab.fill("#id_username", "admin")
            tab.fill("#id_password", "s3cret-pw")
            tab.click("input[type=submit]")
            tab.wait_for_url(f"{live_server.url}/admin/")
            yield tab
        finally:
            browser.close()


def test_admin_index_links_both_pages_and_they_show_the_ledger(page):
    index = page.locator("#content-main .app-scheduling")
    assert index.get_by_role("link", name="Replicas", exact=True).count() == 1

    page.get_by_role("link", name="Schedule health", exact=True).first.click()
    page.wait_for_selector("#schedule-health")
    page.screenshot(path=str(ARTIFACTS / "schedule_health.png"), full_page=True)
    page.emulate_media(color_scheme="dark")  # the admin's dark theme: the same page, readable
    page.screenshot(path=str(ARTIFACTS / "schedule_health_dark.png"), full_page=True)
    page.emulate_media(color_scheme="light")

    names = page.locator("tr.task-row th.task-name a").all_inner_texts()
    assert names == [MINUTELY, HOURLY, REPORT, SYNC]
    sparse = page.locator("tr.task-row").filter(has_not_text=MINUTELY)
    marks = {
        outcome: sparse.locator(f"g.mark-{outcome}").count()
        for outcome in ("succeeded", "failed", "active", "missed", "skipped", "cancelled",
                        "expired")
    }
    assert marks == {
        "succeeded": 10, "failed": 1, "active": 1, "missed": 2, "skipped": 1, "cancelled": 1,
        "expired": 1,
    }
    dense = page.locator("tr.task-row", has_text=MINUTELY)
    runs = dense.locator("g.mark-succeeded").evaluate_all(
        "marks => marks.map(m => Number(m.dataset.runs))"
    )
    assert len(runs) == 24 and max(runs) == 60 and sum(runs) == 1427
    assert dense.locator("g.mark-failed").count() == 3
    assert dense.locator("td.runs").inner_text() == "1430"
    sync = page.locator("tr.task-row", has_text=SYNC)
    assert sync.locator("g.mark-missed").count() == 2
    cells = [sync.locator(f"td.{c}").inner_text() for c in ("runs", "missed", "skipped", "max")]
    assert cells == ["6", "2", "1", "90.000 s"]
    failed_title = page.locator("tr.task-row", has_text=HOURLY).locator(
        "g.mark-failed title"
    ).text_content()
    assert failed_title is not None and failed_title.endswith(f"lateness 0.250 s · {XSS_ERROR}")
    assert page.evaluate("window.pwned === undefined")  # the error text was not run as script
    assert page.locator("#health-legend .legend-item").all_inner_texts() == [
        "succeeded", "pending / running", "cancelled", "skipped (overlap)", "missed (misfire)",
        "expired", "failed",
    ]

    page.get_by_role("link", name="Replicas", exact=True).first.click()
    page.wait_for_selector("#result_list")
    page.screenshot(path=str(ARTIFACTS / "replicas.png"), full_page=True)
    rows = page.locator("#result_list tbody tr")
    shown = [
        (
            row.locator("th.field-id").inner_text(),
            row.locator("td.field-runs_claimed").inner_text(),
            row.locator("td.field-display_state").inner_text().strip(),
        )
        for row in rows.all()
    ]
    assert [(name, runs) for name, runs, _ in shown] == [
        ("replica-live", "7"), ("replica-stale", "3"), ("replica-stopped", "2"),
    ]
    assert shown[0][2] == "live"
    stale = re.fullmatch(r"stale: no tick for (\d+) s", shown[1][2])
    assert stale and 600 <= int(stale[1]) < 780  # seeded 600 s ago, stale while under 180 s
    assert shown[2][2].startswith("stopped 20")
