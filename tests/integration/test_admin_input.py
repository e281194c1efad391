"""Admin forms refuse at input what would only fail runs later (issue 5, bad input)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

# through the test client: the same on any database or broker
pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def admin_client_(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _task_form(**fields: str) -> dict[str, str]:
    interval, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    return {
        "name": "nightly", "regtask": "", "task": "project.tasks.record", "enabled": "on",
        "description": "", "interval": str(interval.pk), "crontab": "", "solar": "",
        "clocked": "", "start_time_0": "", "start_time_1": "", "args": "[]", "kwargs": "{}",
        "expires_0": "", "expires_1": "", "expire_seconds": "", "queue": "", "exchange": "",
        "routing_key": "", "priority": "", "headers": "{}",
        "scheduling_policy-TOTAL_FORMS": "0", "scheduling_policy-INITIAL_FORMS": "0",
        "scheduling_policy-MIN_NUM_FORMS": "0", "scheduling_policy-MAX_NUM_FORMS": "1",
        **fields,
    }


def _add_task(client, **fields: str):
    return client.post(reverse("admin:django_celery_beat_periodictask_add"), _task_form(**fields))


def test_a_valid_periodic_task_is_saved(admin_client_):
    response = _add_task(admin_client_, args="[1]", kwargs='{"a": 1}', headers='{"h": "v"}')
    assert response.status_code == 302
    assert list(PeriodicTask.objects.values_list("name", "args")) == [("nightly", "[1]")]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (
            {"args": "[1, 2"},
            "invalid args JSON: Expecting &#x27;,&#x27; delimiter: line 1 column 6 (char 5)",
        ),
        ({"args": '{"a": 1}'}, "args must be a JSON list, got dict"),
        (
            {"kwargs": "{'a': 1}"},
            "invalid kwargs JSON: Expecting property name enclosed in double quotes: line 1"
            " column 2 (char 1)",
        ),
        ({"kwargs": "[1]"}, "kwargs must be a JSON dict, got list"),
        (
            {"headers": "not json"},
            "invalid headers JSON: Expecting value: line 1 column 1 (char 0)",
        ),
        ({"headers": "[]"}, "headers must be a JSON dict, got list"),
        (
            {"task": "nowhere.tasks.missing"},
            "unknown task name &#x27;nowhere.tasks.missing&#x27;: not registered in this app",
        ),
    ],
)
def test_a_periodic_task_that_would_fail_its_runs_is_refused(admin_client_, fields, error):
    response = _add_task(admin_client_, **fields)
    assert response.status_code == 200  # the form again, with the error
    assert error in response.content.decode()
    assert PeriodicTask.objects.count() == 0


# the schedule admins' inline of periodic tasks, empty
_NO_INLINE_TASKS = {
    f"periodictask_set-{n}": "0" for n in ("TOTAL_FORMS", "INITIAL_FORMS", "MIN_NUM_FORMS",
                                           "MAX_NUM_FORMS")
}


def _crontab_form(**fields: str) -> dict[str, str]:
    return {
        "minute": "0", "hour": "0", "day_of_month": "*", "month_of_year": "*",
        "day_of_week": "*", "timezone": "UTC", **_NO_INLINE_TASKS, **fields,
    }


def test_a_crontab_that_never_fires_is_refused_and_a_rare_one_is_saved(admin_client_):
    url = reverse("admin:django_celery_beat_crontabschedule_add")
    never = admin_client_.post(url, _crontab_form(day_of_month="31", month_of_year="2"))
    assert never.status_code == 200
    assert (
        "invalid crontab 0 0 31 2 *: day_of_month &#x27;31&#x27; never occurs"
        " in month_of_year &#x27;2&#x27;<" in never.content.decode()
    )
    assert CrontabSchedule.objects.count() == 0
    # 29 February on a Monday: years apart, but it comes
    rare = admin_client_.post(url, _crontab_form(day_of_month="29", month_of_year="2",
                                                 day_of_week="1"))
    assert rare.status_code == 302
    assert CrontabSchedule.objects.count() == 1


def test_each_invalid_crontab_field_gets_its_own_error_and_no_words(admin_client_):
    """Minute 99 and hour abc: two errors, each naming its field (not one about a weekday), and
    "human readable" does not put the refused text into words."""
    url = reverse("admin:django_celery_beat_crontabschedule_add")
    page = admin_client_.post(url, _crontab_form(minute="99", hour="abc")).content.decode()
    errors = re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.DOTALL)
    assert [re.sub(r"<[^>]+>", "", e) for e in errors] == [
        "Invalid minute &#x27;99&#x27;: use 0-59, *, lists (1,2), ranges (1-5) or steps (*/15).",
        "Invalid hour &#x27;abc&#x27;: use 0-23, *, lists (1,2), ranges (1-5) or steps (*/15).",
    ]
    readable = re.search(r'field-human_readable.*?<div class="readonly">(.*?)</div>', page, re.DOTALL)
    assert readable[1] == "- (correct the fields marked below)"
    assert CrontabSchedule.objects.count() == 0


def test_a_refused_save_keeps_the_saved_tasks_name_in_title_and_breadcrumb(admin_client_):
    interval, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    task = PeriodicTask.objects.create(
        name="nightly", task="project.tasks.record", interval=interval
    )
    crontab = CrontabSchedule.objects.create(minute="30", hour="2")
    url = reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    page = admin_client_.post(url, _task_form(crontab=str(crontab.pk))).content.decode()
    assert "Only one of clocked, interval, crontab, or solar must be set" in page
    title = re.search(r"<title>(.*?)</title>", page, re.DOTALL)[1]
    assert title == "Error: nightly: every 60 seconds | Change periodic task | Django site admin"
    crumbs = page.split('<div class="breadcrumbs">', 1)[1].split("</div>", 1)[0]
    assert crumbs.strip().splitlines()[-1].strip() == "&rsaquo; nightly: every 60 seconds"
    assert "<h2>nightly: every 60 seconds</h2>" in page


def _task_fields(page: str) -> tuple[list[str], str]:
    """The options selected in "Task (registered)", and the "Task (custom)" input's value."""
    select = re.search(r'<select name="regtask".*?</select>', page, re.DOTALL)[0]
    custom = re.search(r'<input type="text" name="task"[^>]*>', page)[0]
    value = re.search(r'value="([^"]*)"', custom)
    return re.findall(r'<option value="([^"]*)" selected>', select), value[1] if value else ""


def test_a_registered_task_shows_in_the_dropdown_saved_and_after_a_refused_save(admin_client_):
    interval, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    task = PeriodicTask.objects.create(
        name="nightly", task="project.tasks.send_digest", interval=interval
    )
    url = reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    assert _task_fields(admin_client_.get(url).content.decode()) == (
        ["project.tasks.send_digest"], ""
    )
    crontab = CrontabSchedule.objects.create(minute="30", hour="2")
    refused = admin_client_.post(
        reverse("admin:django_celery_beat_periodictask_add"),
        _task_form(name="digest", task="project.tasks.send_digest", crontab=str(crontab.pk)),
    ).content.decode()
    assert "Only one of clocked, interval, crontab, or solar must be set" in refused
    assert _task_fields(refused) == (["project.tasks.send_digest"], "")


def test_an_interval_of_zero_is_refused(admin_client_):
    url = reverse("admin:django_celery_beat_intervalschedule_add")
    response = admin_client_.post(url, {"every": "0", "period": "seconds", **_NO_INLINE_TASKS})
    assert response.status_code == 200
    assert "Ensure this value is greater than or equal to 1." in response.content.decode()
    assert IntervalSchedule.objects.count() == 0


SUB_SECOND = (
    "An interval shorter than 1 second is refused: the replicas claim runs about twice a second, "
    "so it would only pile up runs due at once."
)


@pytest.mark.parametrize(
    ("every", "period", "refused"),
    [("1", "microseconds", True), ("999999", "microseconds", True), ("1", "seconds", False)],
)
def test_an_interval_shorter_than_a_second_is_refused(admin_client_, every, period, refused):
    response = admin_client_.post(
        reverse("admin:django_celery_beat_intervalschedule_add"),
        {"every": every, "period": period, "periodictask_set-TOTAL_FORMS": "0",
         "periodictask_set-INITIAL_FORMS": "0"},
    )
    assert (SUB_SECOND in response.content.decode()) is refused
    assert IntervalSchedule.objects.exists() is not refused


def test_a_task_on_a_sub_second_interval_is_refused(admin_client_):
    flood = IntervalSchedule.objects.create(every=1, period="microseconds")
    page = _add_task(admin_client_, interval=str(flood.pk)).content.decode()
    assert SUB_SECOND in page
    assert not PeriodicTask.objects.exists()
