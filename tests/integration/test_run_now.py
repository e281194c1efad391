"""Run now: it never consumes or moves the next scheduled slot; disabled or finished needs force.

The manual run and the scheduled run after it go through real claims on PostgreSQL; the command
and the admin action are driven as a user would (``call_command``, the test client).
"""

from __future__ import annotations

import time
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.urls import reverse

from scheduling import ledger, slots
from scheduling.exceptions import RunNowRefused
from scheduling.models import Run
from scheduling.upcoming import upcoming_slots
from tests.conftest import utc
from tests.integration.conftest import GRACE, claim

pytestmark = pytest.mark.django_db(transaction=True)


def _wait_for_database_clock(moment) -> None:
    deadline = time.monotonic() + 30
    while ledger.database_now() < moment:
        assert time.monotonic() < deadline, f"the database clock did not reach {moment}"
        time.sleep(0.05)


def test_the_scheduled_run_after_a_manual_one_happens_at_its_slot(make_task, recorder):
    # The slot 15 s ahead: the manual run's claim must come before it (3 s was passed at load 20).
    start = ledger.database_now().replace(microsecond=0) + timedelta(seconds=15)
    task = make_task(every=5, start_time=start, name="every 5 s")
    ledger.reconcile(GRACE)
    planned = Run.objects.pending().get(periodic_task=task)
    assert planned.scheduled_for == start
    before = upcoming_slots(task, ledger.database_now(), 3)

    manual = ledger.request_run(task, requested_by="test")
    assert [r.run_id for r in claim(recorder)] == [manual.pk]  # the manual run alone is due
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (None, 0)  # the schedule did not move
    still = Run.objects.pending().get(periodic_task=task)
    assert (still.pk, still.scheduled_for, still.task_id) == (
        planned.pk, start, slots.task_id_for(task.pk, start)
    )
    assert upcoming_slots(task, ledger.database_now(), 3) == before

    _wait_for_database_clock(start)
    done = claim(recorder)
    assert [(d.run_id, d.status, d.trigger) for d in done] == [
        (planned.pk, Run.Status.DISPATCHED, Run.Trigger.SCHEDULE)
    ]
    assert recorder.task_ids == [manual.task_id, slots.task_id_for(task.pk, start)]
    assert list(
        Run.objects.pending().filter(periodic_task=task).values_list("scheduled_for", flat=True)
    ) == [start + timedelta(seconds=5)]
    task.refresh_from_db()
    assert (task.last_run_at, task.total_run_count) == (start, 1)


@pytest.fixture
def finished_tasks(make_task):
    past = utc(2026, 1, 5, 10, 0)
    return {
        "disabled": make_task(every=60, name="Nightly report", enabled=False),
        "clocked": make_task(clocked=past, name="one-off", enabled=False),
        "expired": make_task(every=60, name="expired", expires=past),
        "one_off": make_task(every=60, name="once", one_off=True, last_run_at=past),
    }


EXPECTED_WHY = {
    "disabled": "'Nightly report' is disabled",
    "clocked": "'one-off' is finished (its clocked time 2026-01-05 10:00:00 UTC has passed) "
    "and disabled",
    "expired": "'expired' is finished (it expired at 2026-01-05 10:00:00 UTC)",
    "one_off": "'once' is finished (its one-off run is done)",
}


def test_run_now_of_a_disabled_or_finished_task_says_why(finished_tasks, make_task):
    now = ledger.database_now()
    assert {
        key: ledger.run_now_refusal(task, now) for key, task in finished_tasks.items()
    } == EXPECTED_WHY
    assert ledger.run_now_refusal(make_task(every=60), now) is None
    with pytest.raises(RunNowRefused, match="^'Nightly report' is disabled$"):
        ledger.request_run(finished_tasks["disabled"])
    assert Run.objects.filter(trigger=Run.Trigger.MANUAL).count() == 0


@pytest.mark.parametrize("key", sorted(EXPECTED_WHY))
def test_the_command_asks_for_force_and_runs_with_it(finished_tasks, key):
    task = finished_tasks[key]
    with pytest.raises(CommandError) as refused:
        call_command("run_now", task.name)
    assert str(refused.value) == (
        f"not queued: {EXPECTED_WHY[key]}; pass --force to run it anyway"
    )
    assert Run.objects.filter(trigger=Run.Trigger.MANUAL).count() == 0
    out = StringIO()
    call_command("run_now", task.name, "--force", "--requested-by", "ops", stdout=out)
    run = Run.objects.get(trigger=Run.Trigger.MANUAL)
    assert out.getvalue() == (
        f"manual run {run.pk} of {task.name!r} queued (Celery task id {run.task_id}), "
        "requested by ops\n"
    )
    task.refresh_from_db()
    assert task.enabled == (key in ("expired", "one_off"))  # forcing changes nothing else


def test_the_admin_action_asks_to_confirm_naming_why(client, finished_tasks, make_task):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    live = make_task(every=60, name="live")
    selected = [live.pk, finished_tasks["disabled"].pk, finished_tasks["clocked"].pk]
    url = reverse("admin:django_celery_beat_periodictask_changelist")
    asked = client.post(url, {"action": "run_tasks", "_selected_action": selected})
    page = asked.content.decode()
    assert asked.status_code == 200
    assert "Run disabled or finished tasks now?" in page
    assert "These tasks would not run on their own" in page
    assert "<p>Selected: " in page and 'value="Run them now anyway"' in page
    assert "<li>&#x27;Nightly report&#x27; is disabled</li>" in page
    assert (
        "<li>&#x27;one-off&#x27; is finished (its clocked time 2026-01-05 10:00:00 UTC has "
        "passed) and disabled</li>"
    ) in page
    assert Run.objects.filter(trigger=Run.Trigger.MANUAL).count() == 0  # nothing until confirmed

    done = client.post(
        url, {"action": "run_tasks", "_selected_action": selected, "confirm": "yes"}, follow=True
    )
    assert "3 manual runs queued" in done.content.decode()
    assert sorted(
        Run.objects.filter(trigger=Run.Trigger.MANUAL).values_list("periodic_task_id", flat=True)
    ) == sorted(selected)
