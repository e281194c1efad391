"""One UPDATE of thousands of periodic tasks, after an edit of one in the same session: the
change-log and edit-history triggers record every row, in time linear in the rows.

PL/pgSQL keeps a static statement's plan for the session; the triggers' joins of their transition
tables were planned for the first statement's size (one row: a nested loop) and reused, so
disabling 3,000 tasks took 197 s (migration 0018). The bound below is forty times what it takes
now on a busy machine, and a fraction of what the nested loop took on an idle one (90 s for
2,000 tasks).
"""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django_celery_beat.models import CrontabSchedule, PeriodicTask, PeriodicTasks

from scheduling.models import ScheduleChange, TaskHistory, TaskVersion

pytestmark = pytest.mark.django_db

TASKS = 2_000
BOUND = 10.0  # seconds


def test_disabling_thousands_of_tasks_after_one_edit_records_each_in_linear_time():
    crontab = CrontabSchedule.objects.create(minute="0", hour="3")
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"bulk-{i}", task="project.tasks.record", crontab=crontab)
        for i in range(TASKS)
    )
    ids = list(PeriodicTask.objects.filter(name__startswith="bulk-").values_list("pk", flat=True))
    PeriodicTask.objects.filter(pk=ids[0]).update(description="one edit first: a one-row plan")
    marker = PeriodicTasks.objects.get(ident=1).last_update
    changes, entries = ScheduleChange.objects.count(), TaskHistory.objects.count()

    started = time.monotonic()
    assert PeriodicTask.objects.filter(pk__in=ids).update(enabled=False) == TASKS
    took = time.monotonic() - started

    assert took < BOUND, f"disabling {TASKS} tasks took {took:.1f} s"
    logged = ScheduleChange.objects.order_by("id")[changes:]
    assert sorted((c.kind, c.object_id) for c in logged) == sorted(("task", pk) for pk in ids)
    recorded = TaskHistory.objects.order_by("id")[entries:]
    assert sorted(
        (e.periodic_task_id, e.operation, e.before, e.after) for e in recorded
    ) == sorted((pk, "changed", {"enabled": True}, {"enabled": False}) for pk in ids)
    # Disabling alone does not move the change marker (the claim cancels a disabled task's run).
    assert PeriodicTasks.objects.get(ident=1).last_update == marker
    with connection.cursor() as cursor:  # and the same session still plans one row's edit
        cursor.execute("UPDATE django_celery_beat_periodictask SET enabled = true WHERE id = %s",
                       [ids[0]])
    assert ScheduleChange.objects.order_by("-id").values_list("kind", "object_id")[0] == (
        "task", ids[0])


def test_a_bulk_insert_update_and_delete_record_each_row_once_with_its_version():
    # More rows than an edit's: each statement's one history statement (migration 0003) writes
    # every row, in order of versions.
    crontab = CrontabSchedule.objects.create(minute="0", hour="3")
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"part-{i}", task="project.tasks.record", crontab=crontab)
        for i in range(20)
    )
    ids = sorted(PeriodicTask.objects.filter(name__startswith="part-").values_list("pk", flat=True))
    assert PeriodicTask.objects.filter(pk__in=ids).update(enabled=False) == 20
    assert sorted(TaskVersion.objects.filter(periodic_task_id__in=ids).values_list(
        "periodic_task_id", "version")) == [(pk, 2) for pk in ids]
    PeriodicTask.objects.filter(pk__in=ids).delete()
    recorded = TaskHistory.objects.filter(periodic_task_id__in=ids)
    assert sorted(recorded.values_list("periodic_task_id", "version", "operation")) == sorted(
        (pk, version, operation) for pk in ids
        for version, operation in ((1, "created"), (2, "changed"), (3, "deleted"))
    )
    assert [(e.before, e.after) for e in recorded.filter(operation="changed")] == [
        ({"enabled": True}, {"enabled": False})] * 20
    created = recorded.get(periodic_task_id=ids[0], operation="created")
    assert (created.before, created.after["name"], created.periodic_task_name) == (
        None, "part-0", "part-0")
    deleted = recorded.get(periodic_task_id=ids[0], operation="deleted")
    assert (deleted.before["enabled"], deleted.after) == (False, None)
    assert "last_run_at" not in created.after and "total_run_count" not in deleted.before
    assert not TaskVersion.objects.filter(periodic_task_id__in=ids).exists()


def test_an_update_of_more_than_a_jsonb_arrays_256_mb_is_recorded():
    # Each row is 1 MB before and 1 MB after: 300 MB in one array, past PostgreSQL's limit
    # (268,435,455 bytes), which a million-task UPDATE reached in issue 17's bench.
    big = "x" * 1_000_000
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"large-{i}", task="project.tasks.record", description=big,
                     crontab=CrontabSchedule.objects.create(minute="0", hour="3"))
        for i in range(150)
    )
    ids = list(PeriodicTask.objects.filter(name__startswith="large-").values_list("pk", flat=True))
    assert PeriodicTask.objects.filter(pk__in=ids).update(enabled=False) == 150
    # Only these tasks' entries: a test that ran before in another process may have committed its
    # own tasks' history, which outlives their tasks by design.
    recorded = TaskHistory.objects.filter(periodic_task_id__in=ids, operation="changed")
    assert sorted(recorded.values_list("periodic_task_id", "after")) == sorted(
        (pk, {"enabled": False}) for pk in ids)
