"""The admin pages in a real browser: Debian's chromium via Playwright, 1,280 x 800, sidebar open.

The ledger and replicas are seeded (tests/pages_seed.py) before the browser starts: Playwright's
sync API runs an event loop in this thread, where Django refuses ORM calls. The app is served by
pytest-django's live_server. Full-page screenshots go to ``tests/artifacts/`` (git-ignored; the
CI artifacts, listed in docs/development.md): look at them after a change to a page.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from scheduling import cadences
from scheduling.models import Run
from scheduling.outcomes import outcome_of
from tests.pages_seed import (
    BUSY,
    BUSY_SUCCEEDED,
    HOURLY,
    MINUTELY,
    PROBE,
    REPLICA_ID,
    REPORT,
    SYNC,
    XSS_ERROR,
    SeededRun,
    seed_ledger,
    seed_replicas,
    seed_windows,
)

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
WINDOWS = {"1h": (timedelta(hours=1), 60), "24h": (timedelta(days=1), 96), "7d": (timedelta(days=7), 84)}


@pytest.fixture
def seeded() -> list[SeededRun]:
    """The ledger of tests/pages_seed.py, the replicas, and a superuser; the windows' runs."""
    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pw")
    seed_ledger()
    seed_replicas()
    return seed_windows()


@pytest.fixture
def page(live_server, monkeypatch, seeded) -> Iterator[object]:
    """A logged-in chromium page at 1,280 x 800 (the superuser went through the login form).

    Heartbeats every 60 s: the live replica stays live (stale after 180 s) however slowly a
    loaded machine gets from seeding to the replicas page.
    """
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    monkeypatch.setattr(cadences, "HEARTBEAT_INTERVAL", 60)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            tab = browser.new_page(viewport=VIEWPORT)
            tab.base = live_server.url
            tab.goto(f"{live_server.url}/admin/login/?next=/admin/")
            tab.fill("#id_username", "admin")
            tab.fill("#id_password", "s3cret-pw")
            tab.click("input[type=submit]")
            tab.wait_for_url(f"{live_server.url}/admin/")
            yield tab
        finally:
            browser.close()


def _fits(page, name: str) -> None:
    """The page is drawn with the sidebar open, without horizontal scroll (of the page or of
    any box in it: the changelist scrolls its results box); a screenshot kept."""
    assert page.locator("#nav-sidebar").is_visible()
    assert page.locator("#main.shifted").count() == 1  # the sidebar is open, not collapsed
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}_1280x800.png"))  # what the window shows
    _no_sideways(page, name)


def _no_sideways(page, name: str) -> None:
    """No horizontal scroll: of the page, of any box in it (the changelist scrolls its results
    box), and no content past the window's right edge."""
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], f"{name}: {widths[0]} px wide in a {widths[1]} px window"
    scrolled = page.evaluate(
        """() => [...document.querySelectorAll('#content *')]
            .filter(e => e.scrollWidth > e.clientWidth + 1
                    && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
            .map(e => `${e.tagName}.${e.className}: ${e.scrollWidth} > ${e.clientWidth}`)"""
    )
    assert scrolled == [], f"{name}: boxes that scroll sideways: {scrolled}"
    right = page.evaluate(
        "Math.max(...[...document.querySelectorAll('#content *')]"
        ".map(e => e.getBoundingClientRect().right))"
    )
    assert right <= widths[1], f"{name}: content reaches {right} px"


def _marks(page, task: str) -> list[dict]:
    return page.locator(f'tbody.task[data-task="{task}"] g.mark').evaluate_all(
        """marks => marks.map(m => {
            const r = m.querySelector('rect');
            return {outcome: m.getAttribute('class').split(' ')[1].slice(5),
                    lane: m.dataset.lane, bucket: Number(m.dataset.bucket),
                    runs: Number(m.dataset.runs), title: m.querySelector('title').textContent,
                    y: Number(r.getAttribute('y')), height: Number(r.getAttribute('height'))};
        })"""
    )


def _expected(runs: list[SeededRun], task: str, origin: datetime, end: datetime,
              step: float) -> Counter:
    """(bucket, lane, outcome) -> runs, from the seeded rows alone."""
    found: Counter = Counter()
    for run in runs:
        if run.task == task and origin <= run.scheduled_for < end:
            bucket = math.floor((run.scheduled_for - origin).total_seconds() / step)
            lane = "scheduled" if run.trigger == Run.Trigger.SCHEDULE else "other"
            found[(bucket, lane, outcome_of(run.status).key)] += 1
    return found


def _no_mark_hides_another(marks: list[dict]) -> None:
    """In each column, the segments are stacked: disjoint, each at least 3 px, filling it."""
    columns: dict[tuple[int, str], list[dict]] = {}
    for mark in marks:
        columns.setdefault((mark["bucket"], mark["lane"]), []).append(mark)
    for (_bucket, lane), segments in columns.items():
        segments.sort(key=lambda m: m["y"])
        for upper, lower in itertools.pairwise(segments):
            assert upper["y"] + upper["height"] <= lower["y"] + 0.01
        full = 20 if lane == "scheduled" else 10
        assert abs(sum(m["height"] for m in segments) - full) < 0.05
        if 3 * len(segments) < full:
            assert min(m["height"] for m in segments) >= 3 - 0.01


def _row_cells(page, task: str) -> dict[str, str]:
    row = page.locator(f'tr.task-row[data-task="{task}"]')
    return dict(row.locator("td.num").evaluate_all(
        "cells => cells.map(c => [c.classList[1], c.textContent.trim()])"
    ))


def test_each_window_draws_the_exact_marks_and_fits(page, seeded):
    outcome_keys = ("succeeded", "failed", "expired", "missed", "skipped", "cancelled",
                    "running", "pending")
    for key, (span, buckets) in WINDOWS.items():
        page.goto(f"{page.base}/admin/scheduling/schedulehealth/?window={key}")
        table = page.locator("#schedule-health")
        origin = datetime.fromisoformat(table.get_attribute("data-origin"))
        end = datetime.fromisoformat(table.get_attribute("data-end"))
        step = float(table.get_attribute("data-step"))
        assert int(table.get_attribute("data-buckets")) == buckets
        assert step * buckets == span.total_seconds()
        assert origin <= end - span + timedelta(seconds=step) and end <= origin + span
        assert page.locator(".health-preset.selected").get_attribute("data-window") == key
        _fits(page, f"schedule_health_{key}")

        for task in (PROBE, BUSY, HOURLY, SYNC):
            marks = _marks(page, task)
            shown = Counter()
            for mark in marks:
                shown[(mark["bucket"], mark["lane"], mark["outcome"])] += mark["runs"]
            assert len(shown) == len(marks)  # one mark per column and outcome
            if task in (PROBE, BUSY):
                assert shown == _expected(seeded, task, origin, end, step), (key, task)
            _no_mark_hides_another(marks)
        for task in (PROBE, BUSY, HOURLY, SYNC, REPORT, MINUTELY):
            cells = _row_cells(page, task)
            assert sum(int(cells[k]) for k in outcome_keys) == int(cells["runs"]), (key, task)

    # The 24-hour window, figure by figure: a backfill 5,000 s "late" is not in the lateness.
    page.goto(f"{page.base}/admin/scheduling/schedulehealth/?window=24h")
    assert _row_cells(page, PROBE) == {
        "runs": "11", "succeeded": "4", "failed": "1", "expired": "1", "missed": "1",
        "skipped": "1", "cancelled": "1", "running": "1", "pending": "1", "buffered": "0",
        "p95": "2.080 s", "max": "2.500 s", "other": "1 · 1",
    }
    backfill = [m for m in _marks(page, PROBE) if m["lane"] == "other"]
    assert [(m["outcome"], m["runs"]) for m in backfill] == [("running", 1), ("succeeded", 1)]
    assert "1 manual" in backfill[0]["title"] and "1 backfill" in backfill[1]["title"]
    assert all("lateness " not in m["title"] for m in backfill), backfill
    names = page.locator("tr.task-row th.task-name a").all_inner_texts()
    assert names == [BUSY, MINUTELY, HOURLY, REPORT, SYNC, PROBE]
    failed_title = _marks(page, HOURLY)
    failed = [m["title"] for m in failed_title if m["outcome"] == "failed"]
    assert len(failed) == 1 and failed[0].endswith(f"lateness 0.250 s · {XSS_ERROR}")
    assert page.evaluate("window.pwned === undefined")  # the error text was not run as script
    page.emulate_media(color_scheme="dark")  # the admin's dark theme: the same page, readable
    page.screenshot(path=str(ARTIFACTS / "schedule_health_dark.png"), full_page=True)
    page.emulate_media(color_scheme="light")


def test_a_pending_run_beside_95_succeeded_ones_shows_with_exact_counts(page):
    page.goto(f"{page.base}/admin/scheduling/schedulehealth/?window=24h")
    marks = _marks(page, BUSY)
    assert [(m["outcome"], m["runs"]) for m in marks] == [
        ("succeeded", BUSY_SUCCEEDED), ("pending", 1)
    ]
    succeeded, pending = marks
    assert succeeded["bucket"] == pending["bucket"]
    assert succeeded["height"] > pending["height"] >= 3  # the majority is the larger share
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d-\d\d:\d\d UTC · 95 succeeded of 96 runs here "
        r"\(95 succeeded, 1 pending\) · max lateness 0\.004 s",
        succeeded["title"],
    ), succeeded["title"]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC · 1 pending of 96 runs here "
        r"\(95 succeeded, 1 pending\)",
        pending["title"],
    ), pending["title"]
    # Hovering shows each tooltip: the pending mark is not under the succeeded one.
    box = page.locator(f'tbody.task[data-task="{BUSY}"] g.mark-pending rect').bounding_box()
    hit = page.evaluate(
        "([x, y]) => document.elementFromPoint(x, y).parentNode.getAttribute('class')",
        [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2],
    )
    assert hit == "mark mark-pending lane-scheduled"


def test_runs_list_and_task_page_fit_with_status_badges(page):
    page.goto(f"{page.base}/admin/scheduling/run/")
    page.wait_for_selector("#result_list")
    _fits(page, "runs_list")
    headers = page.locator("#result_list thead th").all_text_contents()
    assert [h.strip().lower() for h in headers][-3:] == ["replica · worker", "runtime", "slots · executions · duplicates dropped"]
    badge = page.locator("#result_list td.field-display_status .run-badge").first
    assert badge.evaluate("b => getComputedStyle(b).backgroundColor") != "rgba(0, 0, 0, 0)"
    replica = page.locator(
        f'#result_list td.field-display_replica span.run-cut[title="{REPLICA_ID}"]'
    ).first
    assert replica.inner_text() == REPLICA_ID  # the whole id, cut on screen by CSS
    heights = replica.evaluate("s => [s.getBoundingClientRect().height, parseFloat("
                               "getComputedStyle(s).lineHeight)]")
    assert heights[0] <= heights[1] * 1.5  # one line: the id does not wrap
    last = page.locator("#result_list thead th").last.bounding_box()
    assert last["x"] + last["width"] <= VIEWPORT["width"]

    page.goto(f"{page.base}/admin/django_celery_beat/periodictask/")
    page.wait_for_selector("#result_list")
    _fits(page, "task_list")  # issue 33: name, schedule, state, next run, last outcome, runs
    headers = page.locator("#result_list thead th").all_text_contents()
    assert [h.strip().lower() for h in headers][1:] == [
        "name", "schedule", "state", "next run (utc)", "last outcome (utc)", "runs",
    ]
    row = page.locator("#result_list tr", has=page.get_by_role("link", name=PROBE, exact=True))
    assert row.locator("td.field-display_state").inner_text() == "enabled"
    assert row.locator("td.field-display_last_outcome .run-badge").count() == 1
    runs = row.locator("td.field-display_runs a").get_attribute("href")
    assert runs.startswith("/admin/scheduling/run/?periodic_task__id__exact=")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.screenshot(path=str(ARTIFACTS / "task_list_1440x900.png"))
    width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1]
    page.set_viewport_size(VIEWPORT)
    page.get_by_role("link", name=PROBE, exact=True).click()
    page.wait_for_selector("table.recent-runs")
    _fits(page, "task_page")
    statuses = page.locator("table.recent-runs .run-badge").all_inner_texts()
    assert statuses[:3] == ["pending", "succeeded", "failed"]
    assert page.locator("table.recent-runs .run-badge-failed").count() == 1


def test_replicas_page(page):
    page.goto(f"{page.base}/admin/")
    index = page.locator("#content-main .app-scheduling")
    assert index.get_by_role("link", name="Replicas", exact=True).count() == 1
    page.get_by_role("link", name="Replicas", exact=True).first.click()
    page.wait_for_selector("#result_list")
    _fits(page, "replicas")
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


@pytest.fixture
def edited(seeded) -> str:
    """A task edited with long values (kwargs, description, queue): its history's widest rows."""
    from django_celery_beat.models import PeriodicTask

    task = PeriodicTask.objects.get(name=PROBE)
    task.kwargs = '{"recipients": [' + ", ".join(f'"user{n}@example.com"' for n in range(40)) + "]}"
    task.description = "A description long enough to need several lines. " * 8
    task.queue = "a-queue-name-without-any-space-" * 4
    task.save()
    return task.name


@pytest.mark.parametrize("viewport", [VIEWPORT, {"width": 1440, "height": 900}])
def test_edit_history_wraps_long_changes(edited, page, viewport):
    """Issue 33: the before -> after column wraps; nothing clipped or scrolled at 1,280 or 1,440."""
    page.set_viewport_size(viewport)
    size = f"{viewport['width']}x{viewport['height']}"
    page.goto(f"{page.base}/admin/scheduling/taskhistory/")
    page.wait_for_selector("#result_list")
    page.screenshot(path=str(ARTIFACTS / f"edit_history_{size}.png"), full_page=True)
    _no_sideways(page, f"edit history at {size}")
    changes = page.locator("#result_list td.field-display_changes").first
    assert "user39@example.com" in changes.inner_text()
    box = changes.bounding_box()
    assert box["x"] + box["width"] <= viewport["width"]

    page.goto(f"{page.base}/admin/django_celery_beat/periodictask/")
    page.get_by_role("link", name=edited, exact=True).click()
    page.wait_for_selector("#history-v2")
    page.screenshot(path=str(ARTIFACTS / f"task_page_history_{size}.png"), full_page=True)
    _no_sideways(page, f"task page at {size}")



@pytest.mark.parametrize("viewport", [VIEWPORT, {"width": 1440, "height": 900}])
def test_a_run_page_tells_its_story_first(page, viewport):
    """Issue 33: a run's page starts with its figures and timeline, to the millisecond."""
    page.set_viewport_size(viewport)
    size = f"{viewport['width']}x{viewport['height']}"
    page.goto(f"{page.base}/admin/scheduling/run/?status__exact=failed")
    page.locator("#result_list tbody tr th a").first.click()
    page.wait_for_selector("table.run-timeline")
    page.screenshot(path=str(ARTIFACTS / f"run_page_{size}.png"), full_page=True)
    _no_sideways(page, f"run page at {size}")
    times = page.locator("table.run-timeline td.time").all_inner_texts()
    assert times and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}( \w+)?", t)
                         for t in times)
    story = page.locator("fieldset", has=page.locator("table.run-timeline")).bounding_box()
    raw = page.locator("fieldset", has_text="Raw fields").bounding_box()
    assert story["y"] < raw["y"]
