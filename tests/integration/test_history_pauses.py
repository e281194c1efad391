"""The edit history keeps edits, not saves, and keeps pauses: a save that changes no field (only
``date_changed`` and the bookkeeping columns move) writes nothing; a pause and a resume are
entries of their own (kind ``pause``), written with the pause row; moments show in UTC to the
millisecond with the zone."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse
from django_celery_beat.models import PeriodicTask

from scheduling import history, ledger
from scheduling.exceptions import PauseRejected
from scheduling.models import Pause, TaskHistory, TaskVersion

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]


def _role() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        return cursor.fetchone()[0]


def _entries(task: PeriodicTask) -> list[tuple[int, str, str, str, str]]:
    """(version, kind, operation, actor, role) of the task's history, oldest first."""
    return list(
        TaskHistory.objects.filter(periodic_task_id=task.pk).order_by("id")
        .values_list("version", "kind", "operation", "actor", "role")
    )


def _version(task: PeriodicTask) -> int:
    return TaskVersion.objects.get(periodic_task_id=task.pk).version


def test_a_save_that_changes_nothing_writes_no_entry(make_task):
    task = make_task(every=60, name="nightly export")
    role = _role()
    stored = PeriodicTask.objects.get(pk=task.pk)
    stored.save()  # what django-celery-beat's admin does on "Save" with nothing edited
    assert PeriodicTask.objects.get(pk=task.pk).date_changed > task.date_changed
    PeriodicTask.objects.filter(pk=task.pk).update(
        date_changed=task.date_changed + timedelta(hours=1), last_run_at=task.date_changed,
        total_run_count=7,
    )
    assert _entries(task) == [(1, "task", "created", "", role)]
    assert _version(task) == 1

    PeriodicTask.objects.filter(pk=task.pk).update(description="exports the orders")
    assert _entries(task) == [(1, "task", "created", "", role), (2, "task", "changed", "", role)]
    entry = TaskHistory.objects.get(periodic_task_id=task.pk, version=2)
    assert (entry.before, entry.after) == ({"description": ""}, {"description": "exports the orders"})
    assert "date_changed" not in TaskHistory.objects.get(periodic_task_id=task.pk, version=1).after


def test_pause_and_resume_are_entries_written_with_the_pause(make_task):
    task = make_task(every=60, name="nightly export")
    role = _role()
    paused = ledger.pause(task, by="alice", why="bucket move")
    with pytest.raises(PauseRejected):
        ledger.pause(task, by="carol", why="again")
    resumed = ledger.resume(task, by="bob")
    assert _entries(task) == [
        (1, "task", "created", "", role),
        (1, "pause", "paused", "alice", role),
        (1, "pause", "resumed", "bob", role),
    ]
    assert _version(task) == 1  # a pause changes no definition: no pending run is re-planned
    first, second = TaskHistory.objects.filter(kind="pause").order_by("id")
    assert (first.object_id, first.changed_at, first.before, first.after) == (
        paused.pk, paused.paused_at, None, {"why": "bucket move"},
    )
    assert (second.object_id, second.changed_at, second.after) == (
        resumed.pk, resumed.resumed_at,
        {"why": "bucket move", "paused_at": paused.paused_at.isoformat(), "slots_skipped": 0},
    )
    assert Pause.objects.get().resumed_by == "bob"


def test_a_pause_that_fails_leaves_no_entry(make_task):
    task = make_task(every=60)
    ledger.pause(task, by="alice")
    with pytest.raises(PauseRejected):
        ledger.pause(task, by="carol")
    assert TaskHistory.objects.filter(kind="pause").count() == 1


def test_moments_show_to_the_millisecond_with_the_zone():
    entry = TaskHistory(
        kind="task", operation="changed",
        before={"start_time": "2026-03-01T04:05:06.789123+00:00", "name": "a"},
        after={"start_time": "2026-03-01T06:05:06+02:00", "name": "b"},
    )
    assert str(history.render_changes(entry)) == (
        "<div><code>name</code>: &quot;a&quot; → &quot;b&quot;</div>"
        "<div><code>start_time</code>: 2026-03-01 04:05:06.789 UTC → 2026-03-01 04:05:06.000 UTC"
        "</div>"
    )


def test_the_task_page_and_the_edit_history_list_show_pauses(client, make_task):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    task = make_task(every=60, name="nightly export")
    paused = ledger.pause(task, by="alice", why="bucket move")
    ledger.resume(task, by="bob")
    page = client.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    table = page.split('<table class="task-history">', 1)[1].split("</table>", 1)[0]
    rows = [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>", 1)[1], re.DOTALL)
    ]
    since = f"{paused.paused_at:%Y-%m-%d %H:%M:%S}.{paused.paused_at.microsecond // 1000:03d}"
    assert [row[2:] for row in rows[:2]] == [
        ["bob", "resumed", f"resumed; paused since {since} UTC: bucket move; 0 slots skipped"],
        ["alice", "paused", "paused: bucket move"],
    ]
    assert rows[2][2:4] == [f"SQL role {_role()}", f"task {task.pk} created"]
    assert rows[2][4].startswith("20 columnsargs:")  # the row, without date_changed
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC", row[1]) for row in rows)
    listed = client.get(
        reverse("admin:scheduling_taskhistory_changelist") + "?kind__exact=pause"
    ).content.decode()
    assert re.findall(r'<td class="field-operation">(\w+)</td>', listed) == ["Resumed", "Paused"]
