"""A run's admin page tells its story: the timeline to the millisecond, in UTC and the task's
zone, with its figures, reason and error above the raw fields (issue 33, point 1)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from scheduling.models import Run
from tests.conftest import utc

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]

SLOT = utc(2026, 7, 6, 7, 0)  # 09:00 in Berlin (CEST, +02:00)
ROW = re.compile(
    r'<tr class="moment"><td>([^<]*)</td><td class="time">([^<]*)</td>'
    r'(?:<td class="time">([^<]*)</td>)?<td class="detail">([^<]*)</td></tr>'
)


def _ms(delta_ms: int) -> timedelta:
    return timedelta(milliseconds=delta_ms)


@pytest.fixture
def page(client, make_task):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    task = make_task(cron="0 9 * * *", timezone="Europe/Berlin", name="nightly")
    run = Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=SLOT,
        due_at=SLOT + _ms(1250), planned_at=SLOT - timedelta(hours=1), task_id="t-1",
        status=Run.Status.FAILED, claimed_by="app-1:42", dispatched_at=SLOT + _ms(1262),
        republished=1, republished_at=SLOT + _ms(301_262),
        events=[
            {"at": (SLOT + _ms(301_262)).isoformat(), "kind": "republished",
             "detail": "re-published (1 of 3): no worker started it within 300 s"},
            {"at": (SLOT + _ms(302_500)).isoformat(), "kind": "retry",
             "detail": "attempt 1 failed and is retried: boom",
             "started": (SLOT + _ms(301_300)).isoformat(), "worker": "celery@w1"},
        ],
        started_at=SLOT + _ms(302_600), finished_at=SLOT + _ms(303_801), worker="celery@w2",
        executions=2, retries=1, error="Traceback ...\nValueError: <b>boom</b>",
        reason="",
    )
    return client.get(reverse("admin:scheduling_run_change", args=[run.pk])).content.decode()


def test_the_run_page_shows_its_timeline_to_the_millisecond_in_utc_and_its_zone(page):
    assert ROW.findall(page) == [
        ("planned", "2026-07-06 06:00:00.000", "2026-07-06 08:00:00.000 CEST",
         "the run&#x27;s row written"),
        ("scheduled", "2026-07-06 07:00:00.000", "2026-07-06 09:00:00.000 CEST",
         "the slot (schedule)"),
        ("due", "2026-07-06 07:00:01.250", "2026-07-06 09:00:01.250 CEST", "jitter +1.250 s"),
        ("claimed and dispatched", "2026-07-06 07:00:01.262", "2026-07-06 09:00:01.262 CEST",
         "by replica app-1:42, 0.012 s after it was due"),
        ("re-published", "2026-07-06 07:05:01.262", "2026-07-06 09:05:01.262 CEST",
         "re-published (1 of 3): no worker started it within 300 s"),
        ("started", "2026-07-06 07:05:01.300", "2026-07-06 09:05:01.300 CEST",
         "on worker celery@w1"),
        ("retried", "2026-07-06 07:05:02.500", "2026-07-06 09:05:02.500 CEST",
         "attempt 1 failed and is retried: boom"),
        ("started", "2026-07-06 07:05:02.600", "2026-07-06 09:05:02.600 CEST",
         "attempt 2 on worker celery@w2"),
        ("ended failed", "2026-07-06 07:05:03.801", "2026-07-06 09:05:03.801 CEST", ""),
    ]
    assert "<th>Europe/Berlin</th>" in page


def test_the_run_page_gives_its_figures_and_error_before_the_raw_fields(page):
    figures = re.search(r'<p class="run-story-figures">(.*?)</p>', page, re.S)[1]
    text = re.sub(r"<[^>]+>", "", figures)
    assert " ".join(text.split()) == (
        "failed · lateness 0.012 s · runtime 1.201 s (the last of 2 attempts) · deliveries 2"
        " (dispatch and 1 re-publish) "
        "· executions 2 · duplicates suppressed 0 · Celery retries 1"
    )
    assert "<pre>Traceback ...\nValueError: &lt;b&gt;boom&lt;/b&gt;</pre>" in page
    assert "<code>app-1:42</code>" in page and "<code>celery@w2</code>" in page
    assert page.index("run-timeline") < page.index("Raw fields")
    assert page.count("Definition version") + page.count("definition version") == 1


def test_the_raw_fields_show_their_moments_to_the_millisecond_in_utc(page):
    raw = page[page.index("Raw fields"):]
    shown = dict(re.findall(r"<label>([^<]*) \(UTC\):</label>\s*<div class=\"readonly\">([^<]*)<",
                            raw))
    assert {label: shown[label] for label in ("Dispatched at", "Started at", "Finished at",
                                              "Republished at", "Overdue at")} == {
        "Dispatched at": "2026-07-06 07:00:01.262 UTC",
        "Started at": "2026-07-06 07:05:02.600 UTC",
        "Finished at": "2026-07-06 07:05:03.801 UTC",
        "Republished at": "2026-07-06 07:05:01.262 UTC",
        "Overdue at": "-",
    }
    assert (
        '2026-07-06 07:00:00.000 UTC<div class="help">The slot of the schedule this run is for (UTC);'
        " for a manual run, when it was asked for.</div>" in raw
    )  # the column's help text under it, as for every other raw field


def test_the_raw_fields_help_texts_are_written_for_an_operator(page):
    helps = re.findall(r'<div class="help">(.*?)</div>', page[page.index("Raw fields"):])
    assert (
        "When the run became due (UTC): its slot, plus the task&#x27;s jitter when it has one."
        " Lateness counts from here." in helps
    )
    developer = ("scheduled_for", "ISO time", "[{", "request.retries", "database clock",
                 "scheduling.", "re-publish", "dispatch")
    assert [h for h in helps if any(word in h for word in developer)] == []


def test_a_backfill_run_s_lateness_is_not_measured(client, make_task):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    task = make_task(every=3600, name="hourly")
    run = Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=SLOT,
        trigger=Run.Trigger.BACKFILL, task_id="b-1", status=Run.Status.SUCCEEDED,
        dispatched_at=SLOT + timedelta(hours=5), started_at=SLOT + timedelta(hours=5, seconds=1),
        finished_at=SLOT + timedelta(hours=5, seconds=3), executions=1,
    )
    page = client.get(reverse("admin:scheduling_run_change", args=[run.pk])).content.decode()
    figures = re.sub(r"<[^>]+>", "", re.search(r'run-story-figures">(.*?)</p>', page, re.S)[1])
    assert " ".join(figures.split()).split(" · ")[1:3] == [
        "lateness - (a backfill of a past slot)", "runtime 2.000 s"]


def test_the_run_pages_title_names_its_slot_in_utc_with_the_zone(page):
    assert "<h2>nightly @ 2026-07-06 07:00:00 UTC (failed)</h2>" in page
