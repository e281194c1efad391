"""Admin: the ledger is read-only; "Run now" creates one manual run, dispatched once."""

from __future__ import annotations

import re
from datetime import UTC

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from scheduling.models import Run
from tests.integration.conftest import claim

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_client_(client):
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


def _run_now(client, *tasks):
    return client.post(
        reverse("admin:django_celery_beat_periodictask_changelist"),
        {"action": "run_tasks", "_selected_action": [t.pk for t in tasks]},
        follow=True,
    )


def test_run_now_creates_one_manual_run_per_task_dispatched_once(admin_client_, make_task, recorder):
    first, second = make_task(every=3600), make_task(every=3600)
    response = _run_now(admin_client_, first, second)
    assert response.status_code == 200
    assert (
        "2 manual runs queued; a beat replica dispatches each exactly once."
        in response.content.decode()
    )

    manual = Run.objects.filter(trigger=Run.Trigger.MANUAL)
    assert sorted(manual.values_list("periodic_task_id", "requested_by")) == [
        (first.pk, "root"), (second.pk, "root")
    ]
    claim(recorder)
    claim(recorder)
    assert sorted(recorder.task_ids) == sorted(manual.values_list("task_id", flat=True))
    assert set(manual.values_list("status", flat=True)) == {Run.Status.DISPATCHED}


def test_run_now_of_one_task_says_run_in_the_singular(admin_client_, make_task):
    response = _run_now(admin_client_, make_task(every=3600))
    assert (
        '<li class="success">1 manual run queued; a beat replica dispatches it exactly once.</li>'
        in response.content.decode()
    )


def test_run_now_needs_the_change_permission(client, make_task):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_periodictask"))
    client.force_login(user)
    task = make_task(every=3600)
    response = _run_now(client, task)
    assert Run.objects.filter(trigger=Run.Trigger.MANUAL).count() == 0
    assert response.status_code in (200, 403)


def test_ledger_admin_lists_runs_and_refuses_changes(admin_client_, make_task, recorder):
    task = make_task(every=3600, name="nightly <b>report</b>")
    from scheduling import ledger

    run = ledger.request_run(task, requested_by="root")
    claim(recorder)
    changelist = admin_client_.get(reverse("admin:scheduling_run_changelist"))
    body = changelist.content.decode()
    assert changelist.status_code == 200
    assert "nightly &lt;b&gt;report&lt;/b&gt;" in body
    assert "<b>report</b>" not in body
    assert admin_client_.get(reverse("admin:scheduling_run_add")).status_code == 403
    assert admin_client_.post(reverse("admin:scheduling_run_delete", args=[run.pk])).status_code == 403
    detail = admin_client_.get(reverse("admin:scheduling_run_change", args=[run.pk]))
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()


def test_periodic_task_page_shows_recent_runs(admin_client_, make_task, recorder):
    task = make_task(every=3600)
    from scheduling import ledger

    ledger.request_run(task)
    claim(recorder, replica_id="replica-7")
    page = admin_client_.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    assert "Recent runs" in page
    assert "replica-7" in page and "dispatched" in page
    run = Run.objects.get(periodic_task=task)
    shown = run.scheduled_for.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.") + (
        f"{run.scheduled_for.microsecond // 1000:03d} UTC"
    )
    assert f"<td>{shown}</td>" in page  # as in the runs list: UTC, to the millisecond, with the zone


def test_runs_replica_filter_names_unclaimed_runs(admin_client_, make_task, recorder):
    """A run no replica claimed yet is offered as "not claimed", not as an empty link."""
    from scheduling import ledger

    claimed, waiting = make_task(every=3600), make_task(every=3600)
    ledger.request_run(claimed)
    claim(recorder, replica_id="replica-7")
    ledger.request_run(waiting)
    url = reverse("admin:scheduling_run_changelist")
    body = admin_client_.get(url).content.decode()
    links = re.findall(r'<a href="\?claimed_by=([^"]*)"[^>]*>([^<]*)</a>', body)
    assert links == [("", "not claimed"), ("replica-7", "replica-7")]
    shown = admin_client_.get(url, {"claimed_by": ""}).content.decode()
    assert shown.count('<td class="field-display_replica">') == 1  # the waiting run only


def test_the_example_projects_root_is_the_admin(client):
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, reverse("admin:index"))

def _backfill_action(client, task, **range_):
    data = {"action": "backfill_tasks", "_selected_action": [task.pk], **range_}
    return client.post(
        reverse("admin:django_celery_beat_periodictask_changelist"), data, follow=True
    )


def test_backfill_action_asks_for_a_range_then_creates_the_runs_once(admin_client_, make_task):
    from tests.conftest import utc

    task = make_task(every=60, start_time=utc(2026, 1, 5, 10, 0), name="demo: record every minute")
    form = _backfill_action(admin_client_, task)
    assert form.status_code == 200
    assert 'name="since"' in form.content.decode()
    assert Run.objects.count() == 0

    range_ = {"since": "2026-01-05 10:00:00", "until": "2026-01-05 10:05:00", "apply": "1"}
    done = _backfill_action(admin_client_, task, **range_)
    again = _backfill_action(admin_client_, task, **range_)
    # The task's name as written: the admin capitalises a message's first letter, not the name.
    name = "&#x27;demo: record every minute&#x27;"
    assert f">Backfill of {name}: 5 slots, 5 new backfill runs (0 already there).</li>" in (
        done.content.decode()
    )
    assert f">Backfill of {name}: 5 slots, 0 new backfill runs (5 already there).</li>" in (
        again.content.decode()
    )
    assert "Demo: record" not in done.content.decode()
    assert list(
        Run.objects.order_by("scheduled_for").values_list("trigger", "requested_by")
    ) == [("backfill", "root")] * 5


def test_a_backfill_without_a_slot_of_the_task_is_a_warning(admin_client_, make_task):
    from tests.conftest import utc

    task = make_task(every=3600, start_time=utc(2026, 1, 5, 10, 0), name="hourly")
    range_ = {"since": "2026-01-05 10:10:00", "until": "2026-01-05 10:40:00", "apply": "1"}
    page = _backfill_action(admin_client_, task, **range_).content.decode()
    assert (
        '<li class="warning">Backfill of &#x27;hourly&#x27;: no slot of the task falls in the '
        "range: the range (1800 s) is shorter than its interval (3600 s).</li>"
    ) in page
    assert "0 slots" not in page


def test_backfill_action_needs_the_change_permission(client, make_task):
    user = User.objects.create_user("viewer2", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_periodictask"))
    client.force_login(user)
    task = make_task(every=60)
    _backfill_action(
        client, task, since="2026-01-05 10:00:00", until="2026-01-05 10:05:00", apply="1"
    )
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    ("range_", "error"),
    [
        ({"since": "2026-01-05 10:05:00", "until": "2026-01-05 10:00:00"},
         "Until must be after since."),
        ({"since": "2026-01-05 10:00:00", "until": "2999-01-01 00:00:00"},
         "Until is in the future: the database clock is "),
        ({"since": "not a date", "until": "2026-01-05 10:00:00"}, "Enter a valid date/time."),
    ],
)
def test_backfill_keeps_the_form_on_a_bad_range(admin_client_, make_task, range_, error):
    """Issue 33: the form comes back with what was entered and the error; nothing is created."""
    task = make_task(every=60, name="minutely")
    page = _backfill_action(admin_client_, task, apply="1", **range_).content.decode()
    assert error in page
    assert f'value="{range_["since"]}"' in page and f'value="{range_["until"]}"' in page
    assert 'name="apply" value="Create backfill runs"' in page
    assert Run.objects.count() == 0


def test_backfill_over_succeeded_slots_warns_with_the_count_then_runs_on_confirm(
    admin_client_, make_task
):
    from tests.conftest import utc

    task = make_task(every=60, start_time=utc(2026, 1, 5, 10, 0), name="minutely")
    for minute, status in ((0, Run.Status.SUCCEEDED), (1, Run.Status.SUCCEEDED),
                           (2, Run.Status.FAILED)):
        slot = utc(2026, 1, 5, 10, minute)
        Run.objects.create(
            periodic_task=task, periodic_task_name=task.name, task=task.task,
            scheduled_for=slot, status=status, task_id=f"t-{minute}",
        )
    range_ = {"since": "2026-01-05 10:00:00", "until": "2026-01-05 10:05:00", "apply": "1"}
    warned = _backfill_action(admin_client_, task, **range_).content.decode()
    assert (
        "2 slots of this range already succeeded on schedule and have no backfill run: a backfill"
        " runs them again." in warned
    )
    assert "<li>minutely: 2 slots</li>" in warned
    assert Run.objects.filter(trigger=Run.Trigger.BACKFILL).count() == 0

    # A confirmation given for another range does not count.
    stale = {**range_, "confirm": "2026-01-05T09:00:00+00:00/2026-01-05T10:05:00+00:00"}
    assert "already succeeded" in _backfill_action(admin_client_, task, **stale).content.decode()
    assert Run.objects.filter(trigger=Run.Trigger.BACKFILL).count() == 0

    confirm = "2026-01-05T10:00:00+00:00/2026-01-05T10:05:00+00:00"
    assert f'name="confirm" value="{confirm}"' in warned
    done = _backfill_action(admin_client_, task, confirm=confirm, **range_).content.decode()
    assert "5 slots, 5 new backfill runs (0 already there)." in done
    assert Run.objects.filter(trigger=Run.Trigger.BACKFILL).count() == 5


def test_backfill_warning_leaves_out_manual_runs(admin_client_, make_task):
    """A "run now" in the range is no slot of it: the backfill goes ahead without a warning."""
    from tests.conftest import utc

    task = make_task(every=60, start_time=utc(2026, 1, 5, 10, 0), name="minutely")
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task,
        scheduled_for=utc(2026, 1, 5, 10, 1, 17), trigger=Run.Trigger.MANUAL,
        status=Run.Status.SUCCEEDED, task_id="manual",
    )
    range_ = {"since": "2026-01-05 10:00:00", "until": "2026-01-05 10:03:00", "apply": "1"}
    done = _backfill_action(admin_client_, task, **range_).content.decode()
    assert "already succeeded" not in done
    assert "Backfill of &#x27;minutely&#x27;: 3 slots, 3 new backfill runs (0 already there)." in done
    assert Run.objects.filter(trigger=Run.Trigger.BACKFILL).count() == 3


def test_backfill_warning_counts_only_the_slots_it_runs_again(admin_client_, make_task):
    """A slot that has a backfill run is not run again: repeating a backfill warns of nothing."""
    from tests.conftest import utc

    task = make_task(every=60, start_time=utc(2026, 1, 5, 10, 0), name="minutely")
    for minute in (0, 1):
        Run.objects.create(
            periodic_task=task, periodic_task_name=task.name, task=task.task,
            scheduled_for=utc(2026, 1, 5, 10, minute), status=Run.Status.SUCCEEDED,
            task_id=f"t-{minute}",
        )
    range_ = {"since": "2026-01-05 10:00:00", "until": "2026-01-05 10:03:00", "apply": "1"}
    confirm = "2026-01-05T10:00:00+00:00/2026-01-05T10:03:00+00:00"
    _backfill_action(admin_client_, task, confirm=confirm, **range_)
    Run.objects.filter(trigger=Run.Trigger.BACKFILL).update(status=Run.Status.SUCCEEDED)

    again = _backfill_action(admin_client_, task, **range_).content.decode()
    assert "already succeeded" not in again
    assert "Backfill of &#x27;minutely&#x27;: 3 slots, 0 new backfill runs (3 already there)." in again

    wider = {**range_, "until": "2026-01-05 10:05:00"}
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task,
        scheduled_for=utc(2026, 1, 5, 10, 3), status=Run.Status.SUCCEEDED, task_id="t-3",
    )
    warned = _backfill_action(admin_client_, task, **wider).content.decode()
    assert (
        "1 slot of this range already succeeded on schedule and has no backfill run: a backfill"
        " runs it again." in warned
    )
    assert "<li>minutely: 1 slot</li>" in warned
    assert 'name="apply" value="Run 1 succeeded slot again and backfill"' in warned


def test_backfill_before_the_task_was_created_warns_then_runs_on_confirm(
    admin_client_, make_task
):
    from datetime import timedelta

    from scheduling.models import TaskHistory

    task = make_task(cron="* * * * *", name="every minute")
    created = TaskHistory.objects.get(periodic_task_id=task.pk, operation="created").changed_at
    since = created.astimezone(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    until = since + timedelta(minutes=3)
    range_ = {"since": f"{since:%Y-%m-%d %H:%M:%S}", "until": f"{until:%Y-%m-%d %H:%M:%S}",
              "apply": "1"}
    warned = _backfill_action(admin_client_, task, **range_).content.decode()
    assert (
        "3 slots of this range come before the task was created: a backfill runs them although"
        " the task did not exist then." in warned
    )
    at = f"{created.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
    assert f"<li>every minute: 3 slots before its creation at {at} UTC</li>" in warned
    assert 'name="apply" value="Backfill 3 slots from before the task existed"' in warned
    assert Run.objects.filter(trigger=Run.Trigger.BACKFILL).count() == 0

    confirm = f"{since.isoformat()}/{until.isoformat()}"
    assert f'name="confirm" value="{confirm}"' in warned
    done = _backfill_action(admin_client_, task, confirm=confirm, **range_).content.decode()
    assert "Backfill of &#x27;every minute&#x27;: 3 slots, 3 new backfill runs" in done
    assert Run.objects.filter(trigger=Run.Trigger.BACKFILL).count() == 3


def test_backfill_keeps_the_form_when_a_task_fails_and_backfills_the_others(
    admin_client_, make_task
):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from tests.conftest import utc

    good = make_task(every=60, start_time=utc(2026, 1, 5, 10, 0), name="good")
    broken = make_task(every=120, start_time=utc(2026, 1, 5, 10, 0), name="broken")
    IntervalSchedule.objects.filter(pk=broken.interval_id).update(every=0)  # as raw SQL would
    data = {
        "action": "backfill_tasks", "_selected_action": [good.pk, broken.pk], "apply": "1",
        "since": "2026-01-05 10:00:00", "until": "2026-01-05 10:05:00",
    }
    page = admin_client_.post(
        reverse("admin:django_celery_beat_periodictask_changelist"), data, follow=True
    ).content.decode()
    assert "Backfill of &#x27;broken&#x27;: " in page  # the error, on the form page
    assert 'name="apply" value="Create backfill runs"' in page
    assert 'value="2026-01-05 10:00:00"' in page
    assert "Backfill of &#x27;good&#x27;: 5 slots, 5 new backfill runs" in page
    assert sorted(
        Run.objects.filter(trigger=Run.Trigger.BACKFILL).values_list("periodic_task", flat=True)
    ) == [good.pk] * 5
    assert PeriodicTask.objects.filter(pk=broken.pk).exists()


def test_the_runs_list_shows_no_lateness_for_a_backfill(admin_client_, make_task, recorder):
    from datetime import timedelta

    from scheduling import ledger

    now = ledger.database_now()
    task = make_task(every=3600, name="hourly", start_time=now - timedelta(days=1))
    ledger.backfill(task, now - timedelta(hours=3, minutes=30), now - timedelta(hours=2))
    ledger.request_run(task)
    claim(recorder)
    body = admin_client_.get(reverse("admin:scheduling_run_changelist")).content.decode()
    cells = re.findall(r'<td class="field-display_lateness">([^<]*)</td>', body)
    runs = Run.objects.order_by("-scheduled_for", "-id")
    expected = ["-" if r.trigger == "backfill" else f"{r.lateness.total_seconds():.3f} s" for r in runs]
    assert sorted(r.trigger for r in runs) == ["backfill", "manual"]
    assert cells == expected
