"""Edit history (issue 16): every change of a task or its schedule row kept by triggers, and the
definition version each run was planned from."""

from __future__ import annotations

import re
from datetime import UTC

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.transaction import TransactionManagementError
from django.urls import reverse
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from scheduling import history, ledger
from scheduling.models import Run, TaskHistory, TaskPolicy, TaskVersion
from tests.integration.conftest import GRACE, claim, make_due

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_client_(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _role() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        return cursor.fetchone()[0]


def _entries(task: PeriodicTask) -> list[tuple[int, str, str, str, str]]:
    """(version, kind, operation, actor, role) of the task's history, oldest first."""
    return list(
        history.history_of(task.pk)
        .order_by("version")
        .values_list("version", "kind", "operation", "actor", "role")
    )


def _changed(task: PeriodicTask, version: int) -> tuple[dict, dict]:
    entry = TaskHistory.objects.get(periodic_task_id=task.pk, version=version)
    return entry.before, entry.after


def _runs(task: PeriodicTask) -> list[tuple[str, str, int | None]]:
    """(HH:MM of the slot, status, definition version) of the task's scheduled runs, by id."""
    return [
        (f"{slot:%H:%M}", status, version)
        for slot, status, version in Run.objects.filter(periodic_task=task)
        .order_by("id")
        .values_list("scheduled_for", "status", "definition_version")
    ]


def _task_form(task: PeriodicTask, **fields: str) -> dict[str, str]:
    """The task's admin change form as saved, with ``fields`` changed (no policy inline)."""
    values = {
        "name": task.name, "regtask": "", "task": task.task, "enabled": "on",
        "description": task.description, "interval": "", "crontab": str(task.crontab_id),
        "solar": "", "clocked": "", "start_time_0": "", "start_time_1": "", "args": task.args,
        "kwargs": task.kwargs, "expires_0": "", "expires_1": "", "expire_seconds": "",
        "queue": "", "exchange": "", "routing_key": "", "priority": "", "headers": task.headers,
        "scheduling_policy-TOTAL_FORMS": "0", "scheduling_policy-INITIAL_FORMS": "0",
        "scheduling_policy-MIN_NUM_FORMS": "0", "scheduling_policy-MAX_NUM_FORMS": "1",
    }
    return {**values, **fields}


def test_an_admin_edit_and_a_raw_sql_edit_are_in_the_history_and_name_the_runs_versions(
    admin_client_, make_task
):
    """Issue 16, acceptance 6."""
    task = make_task(cron="0 3 * * *", name="nightly")
    first_crontab, role = task.crontab_id, _role()
    ledger.reconcile(GRACE)
    assert _runs(task) == [("03:00", "pending", 1)]

    later = CrontabSchedule.objects.create(minute="30", hour="6", timezone="UTC")
    url = reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    response = admin_client_.post(url, _task_form(task, crontab=str(later.pk)))
    assert response.status_code == 302
    ledger.reconcile(GRACE)
    assert _runs(task) == [("03:00", "cancelled", 1), ("06:30", "pending", 2)]

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_celery_beat_crontabschedule SET hour = '7' WHERE id = %s", [later.pk]
        )
    ledger.reconcile(GRACE)
    assert _runs(task) == [
        ("03:00", "cancelled", 1), ("06:30", "cancelled", 2), ("07:30", "pending", 3)
    ]

    assert _entries(task) == [
        (1, "task", "created", "", role),
        (2, "task", "changed", "root", role),
        (3, "crontab", "changed", "", role),
    ]
    task.refresh_from_db()
    before, after = _changed(task, 2)
    assert (before, after) == ({"crontab_id": first_crontab}, {"crontab_id": later.pk})
    assert _changed(task, 3) == ({"hour": "6"}, {"hour": "7"})

    page = admin_client_.get(url).content.decode()
    assert '<tr id="history-v3">' in page
    assert f"<td>crontab {later.pk} changed</td>" in page
    assert "<code>hour</code>: &quot;6&quot; → &quot;7&quot;" in page
    assert f"SQL role {role}" in page
    assert "<td>root</td>" in page
    assert '<a href="#history-v3">3</a>' in page  # the pending run's version, in recent runs

    pending = Run.objects.get(periodic_task=task, status=Run.Status.PENDING)
    entry = TaskHistory.objects.get(periodic_task_id=task.pk, version=3)
    run_page = admin_client_.get(reverse("admin:scheduling_run_change", args=[pending.pk]))
    assert (
        f'<a href="{history.entry_url(entry)}">version 3</a>: crontab changed by SQL role {role}'
        in run_page.content.decode()
    )
    entry_page = admin_client_.get(history.entry_url(entry)).content.decode()
    runs_url = (
        reverse("admin:scheduling_run_changelist")
        + f"?periodic_task__id__exact={task.pk}&definition_version=3"
    )
    assert runs_url.replace("&", "&amp;") in entry_page
    listed = admin_client_.get(runs_url).content.decode()
    assert re.findall(r"/admin/scheduling/run/(\d+)/change/", listed) == [str(pending.pk)]


def test_the_claim_plans_the_next_slot_with_the_version_it_read(make_task, recorder):
    task = make_task(every=3600)
    make_due(task)
    assert claim(recorder)[0].status == Run.Status.DISPATCHED
    PeriodicTask.objects.filter(pk=task.pk).update(args="[1]")  # no slot moves: no re-plan
    run = make_due(task)
    assert run.definition_version == 1
    claim(recorder)
    assert list(
        Run.objects.filter(periodic_task=task).order_by("id").values_list(
            "status", "definition_version"
        )
    ) == [("dispatched", 1), ("dispatched", 1), ("pending", 2)]
    assert _changed(task, 2) == ({"args": "[]"}, {"args": "[1]"})


def test_the_claims_bookkeeping_is_no_change(make_task, recorder):
    task = make_task(every=3600)
    for _ in range(3):
        make_due(task)
        claim(recorder)
    task.refresh_from_db()
    assert task.total_run_count == 3
    assert _entries(task) == [(1, "task", "created", "", _role())]
    assert TaskVersion.objects.get(periodic_task=task).version == 1


def test_a_shared_crontab_edit_gives_each_task_its_entry_and_version(make_task):
    tasks = [make_task(cron="0 3 * * *") for _ in range(3)]
    other = make_task(cron="0 4 * * *")
    CrontabSchedule.objects.filter(pk=tasks[0].crontab_id).update(minute="15")
    versions = dict(TaskVersion.objects.values_list("periodic_task_id", "version"))
    assert versions == {tasks[0].pk: 2, tasks[1].pk: 2, tasks[2].pk: 2, other.pk: 1}
    assert [_changed(t, 2) for t in tasks] == [({"minute": "0"}, {"minute": "15"})] * 3


def test_the_actor_is_local_to_its_transaction(make_task):
    task = make_task(every=3600)
    with ledger.acting("alice"):
        PeriodicTask.objects.filter(pk=task.pk).update(description="first")
    PeriodicTask.objects.filter(pk=task.pk).update(description="second")
    assert [entry[3] for entry in _entries(task)] == ["", "alice", ""]
    with pytest.raises(TransactionManagementError):
        ledger.set_actor("bob")


def test_policy_changes_and_deletion_are_kept_after_the_task_is_gone(admin_client_, make_task):
    task = make_task(every=3600, name="to delete")
    TaskPolicy.objects.create(periodic_task=task, overlap_policy=TaskPolicy.Overlap.SKIP)
    url = reverse("admin:django_celery_beat_periodictask_delete", args=[task.pk])
    assert admin_client_.post(url, {"post": "yes"}).status_code == 302
    role = _role()
    assert _entries(task) == [
        (1, "task", "created", "", role),
        (2, "policy", "created", "", role),
        (3, "policy", "deleted", "root", role),
        (4, "task", "deleted", "root", role),
    ]
    before, after = _changed(task, 4)
    assert (before["name"], after) == ("to delete", None)
    assert _changed(task, 2)[1]["overlap_policy"] == "skip"
    assert not TaskVersion.objects.filter(periodic_task_id=task.pk).exists()


def test_a_task_deleted_by_raw_sql_is_recorded(make_task):
    task = make_task(every=3600, name="raw")
    ledger.reconcile(GRACE)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_celery_beat_periodictask WHERE id = %s", [task.pk])
    assert [entry[:3] for entry in _entries(task)] == [(1, "task", "created"), (2, "task", "deleted")]
    assert _changed(task, 2)[0]["name"] == "raw"
    run = Run.objects.get(periodic_task_name="raw")
    assert (run.definition_version, run.periodic_task_id) == (1, None)


def test_a_manual_run_names_its_version(make_task):
    task = make_task(every=3600)
    PeriodicTask.objects.filter(pk=task.pk).update(kwargs='{"a": 1}')
    run = ledger.request_run(PeriodicTask.objects.get(pk=task.pk), requested_by="root")
    assert run.definition_version == 2
    assert history.entry_for(run).changed_at.tzinfo == UTC


def test_the_functions_that_run_in_an_editing_session_turn_jit_off():
    # At 1,000,000 tasks an admin save spent 0.5 s in LLVM compiling the history's statement,
    # estimated from a plan without its arguments (migration 0019). Each function a trigger of
    # the periodic task, schedule or policy tables runs carries jit=off (but the row trigger
    # that bounds date_changed: one assignment, nothing to compile).
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT DISTINCT p.proname, p.proconfig
            FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
            WHERE NOT t.tgisinternal AND t.tgrelid::regclass::text IN (
                'django_celery_beat_periodictask', 'django_celery_beat_intervalschedule',
                'django_celery_beat_crontabschedule', 'django_celery_beat_solarschedule',
                'django_celery_beat_clockedschedule', 'scheduling_taskpolicy')
              AND p.proname <> 'scheduling_date_changed_not_ahead'
            """
        )
        functions = dict(cursor.fetchall())
    assert functions == {
        name: ["jit=off"] for name in (
            "scheduling_note_schedule_change", "scheduling_note_task_change",
            "scheduling_note_task_insert", "scheduling_record_history",
        )
    }


def test_the_task_pages_history_button_opens_its_edit_history(admin_client_, make_task):
    task = make_task(every=60, name="shown")
    make_task(every=60, name="other")
    task_page = admin_client_.get(
        reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    ).content.decode()
    listed = f'{reverse("admin:scheduling_taskhistory_changelist")}?periodic_task_id={task.pk}'
    assert re.findall(r'<a href="([^"]*)" class="historylink">History</a>', task_page) == [listed]
    page = admin_client_.get(listed).content.decode()
    rows = re.findall(r'<th class="field-periodic_task_name"><a href="[^"]*">([^<]*)</a>', page)
    assert rows and set(rows) == {"shown"}
