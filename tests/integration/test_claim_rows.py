"""The claim statement's rows as claimed runs and tasks: the values a model would hold."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django_celery_beat.models import PeriodicTask, SolarSchedule

from scheduling import ledger
from scheduling.ledger import claim_rows as claimed
from scheduling.ledger.claim import claim_due
from scheduling.models import Run, TaskPolicy, TaskVersion
from scheduling.sql import queries
from tests.integration.conftest import make_due

pytestmark = pytest.mark.django_db(transaction=True)


class _Rollback(Exception):
    pass


def _claimed(batch_size: int = 100) -> list[claimed.ClaimedRun]:
    """What a claim locks now, in a transaction rolled back."""
    found: list[claimed.ClaimedRun] = []
    try:
        with transaction.atomic():
            found.extend(claim_due(batch_size))
            raise _Rollback
    except _Rollback:
        pass
    return found


def test_the_statement_gives_every_column_the_claimed_run_and_task_read_by_name():
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(queries["claim"], {"floor": ledger.NO_FLOOR, "limit": 1})
        names = [column.name for column in cursor.description]
    layout = claimed.RowLayout.of(names)  # raises ValueError for a column it lacks
    assert (len(names), len(set(names))) == (61, 61)  # no name given twice
    assert names[layout.task_pk] == "pk"


def test_a_row_is_read_by_its_column_names_whatever_their_order(make_task):
    task = make_task(every=60, queue="q", priority=3)
    make_due(task)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(queries["claim"], {"floor": ledger.NO_FLOOR, "limit": 1})
        names = [column.name for column in cursor.description]
        (row,) = cursor.fetchall()
    order = list(reversed(range(len(names))))  # the statement's columns in the other order
    (as_sent,) = claimed.claimed_runs([row], claimed.RowLayout.of(names))
    (reversed_,) = claimed.claimed_runs(
        [tuple(row[i] for i in order)], claimed.RowLayout.of([names[i] for i in order])
    )
    assert [getattr(reversed_, n) for n in claimed.ClaimedRun.READ] == [
        getattr(as_sent, n) for n in claimed.ClaimedRun.READ
    ]
    assert reversed_.periodic_task == as_sent.periodic_task
    assert (as_sent.periodic_task.queue, as_sent.periodic_task.interval) == (
        "q", claimed.Interval(60, "seconds")
    )


def test_a_statement_without_a_column_a_record_reads_is_refused():
    names = [*claimed.ClaimedRun.READ, "pk", "name"]
    with pytest.raises(ValueError, match="^the claim statement has no column task, enabled, one_"):
        claimed.RowLayout.of(names)


def test_a_claimed_task_holds_what_its_models_hold(make_task):
    now = ledger.database_now()
    interval = make_task(every=90, start_time=now - timedelta(hours=1), queue="q", priority=3,
                         kwargs='{"a": 1}', expire_seconds=30)
    crontab = make_task(cron="15 3 * * 1-5", timezone="Europe/Paris", headers='{"h": 1}')
    solar = make_task(solar=SolarSchedule.objects.create(
        event="sunrise", latitude=Decimal("52.520"), longitude=Decimal("13.405")
    ))
    clocked = make_task(clocked=now + timedelta(days=1), expires=now + timedelta(days=2))
    TaskPolicy.objects.create(
        periodic_task=crontab, misfire_policy=TaskPolicy.Misfire.CATCH_UP, catch_up_limit=4,
        overlap_policy=TaskPolicy.Overlap.SKIP, overlap_stale_seconds=600, jitter_seconds=7,
        misfire_grace_seconds=9,
    )
    tasks = [interval, crontab, solar, clocked]
    for task in tasks:
        make_due(task)

    got = {run.periodic_task_id: run for run in _claimed()}

    assert sorted(got) == sorted(task.pk for task in tasks)
    for task in tasks:
        task = PeriodicTask.objects.select_related(
            "interval", "crontab", "solar", "clocked", "scheduling_policy", "scheduling_version"
        ).get(pk=task.pk)
        row = got[task.pk].periodic_task
        own = claimed.ClaimedTask._fields[:-6]
        assert [getattr(row, name) for name in own] == [getattr(task, name) for name in own]
        for name, kind in (("interval", claimed.Interval), ("crontab", claimed.Crontab),
                           ("solar", claimed.Solar), ("clocked", claimed.Clocked)):
            schedule = getattr(task, name)
            expected = None if schedule is None else kind._make(
                getattr(schedule, field) for field in kind._fields
            )
            assert getattr(row, name) == expected, name
        policy = getattr(task, "scheduling_policy", None)
        assert row.scheduling_policy == (None if policy is None else claimed.Policy._make(
            getattr(policy, field) for field in claimed.Policy._fields
        ))
        assert row.scheduling_version == claimed.Version(task.scheduling_version.version)
    assert got[crontab.pk].periodic_task.scheduling_policy == claimed.Policy(
        "catch_up", 9, 4, "skip", 600, 7, 100, "finish"
    )
    assert str(got[crontab.pk].periodic_task.crontab.timezone) == "Europe/Paris"


def test_a_claimed_run_holds_what_its_row_holds(make_task):
    task = make_task(every=60)
    run = make_due(task)
    (got,) = _claimed()
    row = Run.objects.get(pk=run.pk)
    read = claimed.ClaimedRun.READ[:13]
    assert [getattr(got, name) for name in read] == [getattr(row, name) for name in read]
    assert (got.pk, got.status, got.lateness, got.pause_id, got.busy_since) == (
        run.pk, Run.Status.PENDING, None, None, None
    )
    assert got.db_now >= row.due_at


def test_runs_of_one_task_share_its_claimed_task_and_a_deleted_task_gives_none(make_task):
    task, gone = make_task(every=60), make_task(every=60)
    make_due(task)
    ledger.request_run(task)
    make_due(gone)
    gone.delete()  # its pending run keeps the name; the reconcile pass has not cancelled it yet

    runs = _claimed()

    ours = [run for run in runs if run.periodic_task_id == task.pk]
    assert [run.trigger for run in ours] == [Run.Trigger.SCHEDULE, Run.Trigger.MANUAL]
    assert ours[0].periodic_task is ours[1].periodic_task
    (orphan,) = [run for run in runs if run.periodic_task_id is None]
    assert (orphan.periodic_task, orphan.load_error) == (None, "")


def test_a_task_without_a_version_row_is_claimed_with_none(make_task):
    task = make_task(every=60)
    make_due(task)
    TaskVersion.objects.filter(periodic_task=task).delete()
    (got,) = _claimed()
    assert got.periodic_task.scheduling_version is None
