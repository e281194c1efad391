"""Pause with a reason: nothing dispatched while paused, one skipped row, resume never fires."""

from __future__ import annotations

import getpass
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from scheduling import ledger, slots
from scheduling.exceptions import PauseRejected
from scheduling.models import Pause, Run, TaskPolicy
from tests.integration.conftest import GRACE, claim, claim_in_flight

pytestmark = pytest.mark.django_db(transaction=True)

EVERY = 10

#: An instant as the messages show it (``utc_text``, to the millisecond).
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC"


def _backdated(make_task, late_by: float = 65.0, policy: str | None = None):
    """An interval task (every 10 s) whose pending run is its start_time, ``late_by`` s ago."""
    first = ledger.database_now() - timedelta(seconds=late_by)
    task = make_task(every=EVERY, start_time=first)
    if policy is not None:
        TaskPolicy.objects.create(periodic_task=task, misfire_policy=policy)
    ledger.reconcile(GRACE)
    Run.objects.pending().filter(periodic_task=task).update(
        scheduled_for=first, task_id=slots.task_id_for(task.pk, first)
    )
    return task, first


def _slots_through(first, until) -> int:
    """Slots of the 10 s grid from ``first`` through ``until``, by arithmetic."""
    return int((until - first).total_seconds() // EVERY) + 1


@pytest.mark.parametrize("policy", [None, "skip", "catch_up"])
def test_a_paused_task_dispatches_nothing_and_resume_records_one_skipped_row(
    make_task, recorder, policy
):
    task, first = _backdated(make_task, policy=policy)
    made = ledger.pause(task, by="alice", why="deploy freeze")

    assert claim(recorder) != []
    assert claim(recorder) == []
    ledger.reconcile(GRACE)  # planning leaves a paused task alone
    assert claim(recorder) == []
    assert recorder.messages == []
    skipped = Run.objects.get(periodic_task=task)
    assert (skipped.status, skipped.reason, skipped.slots) == (
        Run.Status.SKIPPED, "paused by alice: deploy freeze", 1
    )
    assert skipped.scheduled_for == first and skipped.dispatched_at is None
    assert Pause.objects.get(pk=made.pk).run_id == skipped.pk

    done = ledger.resume(task, by="bob")

    skipped.refresh_from_db()
    expected = _slots_through(first, done.resumed_at)
    assert expected >= 7
    assert (skipped.status, skipped.slots, skipped.finished_at) == (
        Run.Status.SKIPPED, expected, done.resumed_at
    )
    following = Run.objects.pending().get(periodic_task=task)
    assert following.scheduled_for == first + timedelta(seconds=EVERY * expected)
    assert following.scheduled_for > done.resumed_at  # the first slot after the resume
    assert claim(recorder) == [] and recorder.messages == []  # nothing fires on resume
    rows = Run.objects.filter(periodic_task=task).order_by("scheduled_for")
    assert [(r.status, r.slots) for r in rows] == [("skipped", expected), ("pending", 1)]
    assert (done.paused_by, done.why, done.resumed_by) == ("alice", "deploy freeze", "bob")
    assert done.paused_at == made.paused_at < done.resumed_at


def test_resume_closes_a_due_run_no_replica_claimed_while_paused(make_task, recorder):
    task, first = _backdated(make_task, late_by=35.0)
    ledger.pause(task, by="alice", why="")

    done = ledger.resume(task, by="alice")  # no replica ran meanwhile

    skipped = Run.objects.get(periodic_task=task, status=Run.Status.SKIPPED)
    assert skipped.reason == "paused by alice"
    assert skipped.slots == _slots_through(first, done.resumed_at)
    assert done.run_id == skipped.pk
    following = Run.objects.pending().get(periodic_task=task)
    assert following.scheduled_for > done.resumed_at
    assert claim(recorder) == [] and recorder.messages == []


def test_a_pause_shorter_than_the_slot_leaves_the_pending_run(make_task, recorder):
    task = make_task(every=3600)
    ledger.reconcile(GRACE)
    pending = Run.objects.pending().get(periodic_task=task)
    ledger.pause(task, by="alice", why="a minute")
    done = ledger.resume(task, by="alice")
    assert done.run is None
    assert list(Run.objects.filter(periodic_task=task).values_list("pk", "status")) == [
        (pending.pk, Run.Status.PENDING)
    ]


def test_pause_twice_and_resume_unpaused_are_refused(make_task):
    task = make_task(every=3600)
    with pytest.raises(PauseRejected, match=f"^'{task.name}' is not paused$"):
        ledger.resume(task, by="alice")
    ledger.pause(task, by="alice", why="one")
    with pytest.raises(PauseRejected, match=rf"is already paused since {WHEN} by alice$"):
        ledger.pause(task, by="bob", why="two")
    assert Pause.objects.open().count() == 1


def test_manual_runs_of_a_paused_task_still_run(make_task, recorder):
    task = make_task(every=3600)
    ledger.pause(task, by="alice", why="x")
    run = ledger.request_run(task, requested_by="carol")
    claim(recorder)
    assert recorder.task_ids == [run.task_id]


def test_resume_waits_for_a_claim_holding_the_paused_run(make_task):
    task, first = _backdated(make_task, late_by=25.0)
    ledger.pause(task, by="alice", why="x")
    ledger.request_run(make_task(every=3600))  # something for the slow claim to publish
    with claim_in_flight(pause=1.5) as slow:
        done = ledger.resume(task, by="alice")  # waits for the claim's commit
    assert slow.outcome and {d.status for d in slow.outcome} == {"dispatched", "skipped"}
    skipped = Run.objects.get(periodic_task=task, status=Run.Status.SKIPPED)
    assert done.run_id == skipped.pk
    assert skipped.slots == _slots_through(first, done.resumed_at)
    assert Run.objects.filter(periodic_task=task).count() == 2


def test_commands_pause_and_resume_as_the_os_user(make_task, capsys):
    task = make_task(every=3600, name="nightly report")
    call_command("scheduling_pause", "nightly report", "--reason", "disk full")
    paused = Pause.objects.get(periodic_task=task)
    assert (paused.paused_by, paused.why) == (f"command:{getpass.getuser()}", "disk full")
    with pytest.raises(CommandError, match=rf"already paused since {WHEN} by"):
        call_command("scheduling_pause", "nightly report", "--reason", "again")
    call_command("scheduling_resume", str(task.pk))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("paused nightly report at ")
    assert out[1].endswith(": 0 slots skipped while paused")
    paused.refresh_from_db()
    assert paused.resumed_by == f"command:{getpass.getuser()}"


def test_admin_pause_asks_why_and_the_task_page_says_since_when(client, make_task):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    task = make_task(every=3600, name="export")
    changelist = reverse("admin:django_celery_beat_periodictask_changelist")
    form = client.post(changelist, {"action": "pause_tasks", "_selected_action": [task.pk]})
    assert form.status_code == 200 and 'name="why"' in form.content.decode()
    crumbs = form.content.decode().split('<div class="breadcrumbs">', 1)[1].split("</div>", 1)[0]
    assert [line.strip() for line in crumbs.strip().splitlines()] == [
        f'<a href="{reverse("admin:index")}">Home</a>',
        f'&rsaquo; <a href="{reverse("admin:app_list", args=["django_celery_beat"])}">Periodic'
        " Tasks</a>",
        f'&rsaquo; <a href="{changelist}">Periodic tasks</a>',
        "&rsaquo; Pause periodic tasks",
    ]
    assert not Pause.objects.exists()
    done = client.post(
        changelist,
        {"action": "pause_tasks", "_selected_action": [task.pk], "apply": "1",
         "why": "vendor down"},
        follow=True,
    )
    assert "Paused export." in done.content.decode()
    paused = Pause.objects.get(periodic_task=task)
    page = client.get(reverse("admin:django_celery_beat_periodictask_change", args=[task.pk]))
    since = paused.paused_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    assert f"Paused since {since} UTC by root</strong>: vendor down" in page.content.decode()

    resumed = client.post(
        changelist, {"action": "resume_tasks", "_selected_action": [task.pk]}, follow=True
    )
    assert "Resumed export: 0 slots skipped while paused." in resumed.content.decode()
    paused.refresh_from_db()
    assert paused.resumed_by == "root"
    page = client.get(reverse("admin:django_celery_beat_periodictask_change", args=[task.pk]))
    assert "Not paused." in page.content.decode() and "vendor down" in page.content.decode()


def test_admin_resume_of_a_task_not_paused_keeps_the_case_of_its_name(client, make_task):
    """The admin capitalises a message's first letter: the task's name is never that letter."""
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    task = make_task(every=3600, name="demo: digest every 5 s")
    changelist = reverse("admin:django_celery_beat_periodictask_changelist")
    page = client.post(
        changelist, {"action": "resume_tasks", "_selected_action": [task.pk]}, follow=True
    ).content.decode()
    assert '<li class="warning">&#x27;demo: digest every 5 s&#x27; is not paused</li>' in page
    client.post(
        changelist,
        {"action": "pause_tasks", "_selected_action": [task.pk], "apply": "1", "why": "x"},
    )
    page = client.post(
        changelist,
        {"action": "pause_tasks", "_selected_action": [task.pk], "apply": "1", "why": "y"},
        follow=True,
    ).content.decode()
    assert re.search(
        r'<li class="warning">&#x27;demo: digest every 5 s&#x27; is already paused since '
        rf"{WHEN} by root</li>",
        page,
    )


def test_resume_says_slot_in_the_singular(client, make_task, capsys):
    """One slot skipped is "1 slot", in the admin's message and in the command's line."""
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    changelist = reverse("admin:django_celery_beat_periodictask_changelist")
    task, _ = _backdated(make_task, late_by=3.0)
    ledger.pause(task, by="alice", why="x")
    page = client.post(
        changelist, {"action": "resume_tasks", "_selected_action": [task.pk]}, follow=True
    ).content.decode()
    assert f"Resumed {task.name}: 1 slot skipped while paused." in page
    other, _ = _backdated(make_task, late_by=3.0)
    ledger.pause(other, by="alice", why="x")
    call_command("scheduling_resume", str(other.pk))
    assert capsys.readouterr().out.endswith(": 1 slot skipped while paused\n")
