"""Rows Django cannot load, or absurd ones, fail their own run and stop nothing else."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from scheduling import ledger, slots
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import GRACE, claim, make_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_unknown_time_zone_written_by_sql_fails_only_its_own_run(make_task, recorder, caplog):
    good = make_task(every=60, start_time=ledger.database_now() - timedelta(seconds=1))
    bad = make_task(cron="* * * * *", name="on-mars")
    good_run, bad_run = make_due(good), make_due(bad)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_celery_beat_crontabschedule SET timezone = 'Mars/Olympus' WHERE id = %s",
            [bad.crontab_id],
        )

    claim(recorder)

    assert recorder.task_ids == [good_run.task_id]
    bad_run.refresh_from_db()
    assert (bad_run.status, bad_run.reason) == (Run.Status.FAILED, "invalid schedule")
    assert "Mars/Olympus" in bad_run.error
    assert Run.objects.pending().filter(periodic_task=good).count() == 1

    # Planning goes on for the others, and records the bad task's error once.
    ledger.reconcile(GRACE)
    ledger.reconcile(GRACE)
    failed_plans = Run.objects.filter(periodic_task=bad, error__startswith="cannot load the schedule")
    assert failed_plans.count() == 1
    logged = [m for m in caplog.messages if m.startswith("cannot load periodic task")]
    assert logged == [f"cannot load periodic task 'on-mars' (id {bad.pk}): {failed_plans[0].error}"]


def test_a_run_due_since_1900_is_coalesced_without_stopping_the_batch(make_task, recorder):
    """A 1 s interval three billion slots late: its count is capped, the batch goes on."""
    good = make_task(every=60, start_time=ledger.database_now() - timedelta(seconds=1))
    slot = datetime(1900, 1, 1, tzinfo=UTC)
    ancient = make_task(every=1, start_time=slot)
    good_run = make_due(good)
    Run.objects.filter(periodic_task=ancient, status=Run.Status.PENDING).update(
        scheduled_for=slot, task_id=slots.task_id_for(ancient.pk, slot)
    )

    before = ledger.database_now()
    claim(recorder)
    after = ledger.database_now()

    old = Run.objects.get(periodic_task=ancient, scheduled_for=slot)
    assert (old.status, old.slots) == (Run.Status.DISPATCHED, slots.MAX_COUNTED_SLOTS + 1)
    assert sorted(recorder.task_ids) == sorted([good_run.task_id, old.task_id])
    # the next slot after the claim's clock: up to a second on, and perhaps passed already by now
    following = Run.objects.pending().get(periodic_task=ancient).scheduled_for
    assert before < following <= after + timedelta(seconds=1)


# Bad input (issue 5): each fails or cancels its own run with a clear reason and a log line, and
# the other task's run in the same pass is dispatched and its schedule goes on.


def _good(make_task) -> tuple[PeriodicTask, Run]:
    good = make_task(every=60, name="good")
    return good, make_due(good)


def _assert_unaffected(good: PeriodicTask, good_run: Run, recorder) -> None:
    good_run.refresh_from_db()
    assert good_run.status == Run.Status.DISPATCHED
    assert recorder.task_ids == [good_run.task_id]
    assert Run.objects.pending().filter(periodic_task=good).count() == 1  # its next slot


@pytest.mark.parametrize(
    ("field", "raw", "error"),
    [
        ("args", "[1, 2", "invalid args JSON: Expecting ',' delimiter: line 1 column 6 (char 5)"),
        (
            "kwargs",
            "{'a': 1}",
            "invalid kwargs JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        ),
        ("headers", "not json", "invalid headers JSON: Expecting value: line 1 column 1 (char 0)"),
        ("kwargs", "[1]", "kwargs must be a JSON dict, got list"),
        ("args", '{"a": 1}', "args must be a JSON list, got dict"),
    ],
)
def test_invalid_json_fails_its_own_run_only(make_task, recorder, caplog, field, raw, error):
    good, good_run = _good(make_task)
    bad = make_task(every=60, name="bad", **{field: raw})
    bad_run = make_due(bad)

    claim(recorder)

    bad_run.refresh_from_db()
    assert (bad_run.status, bad_run.reason, bad_run.error) == (
        Run.Status.FAILED, "rejected before dispatch", error
    )
    assert f"run of 'bad' at {bad_run.scheduled_for} rejected: {error}" in caplog.messages
    _assert_unaffected(good, good_run, recorder)
    assert Run.objects.pending().filter(periodic_task=bad).count() == 1  # its schedule goes on


@pytest.mark.parametrize(
    ("schedule", "error"),
    [
        (
            {"cron": "0 0 31 2 *"},  # 31 February never comes
            "invalid crontab 0 0 31 2 *: day_of_month '31' never occurs in month_of_year '2'",
        ),
        ({"every": 0}, "interval must be positive, got 0 seconds"),
    ],
)
def test_a_schedule_without_slots_fails_one_run_once(make_task, recorder, caplog, schedule, error):
    good, good_run = _good(make_task)
    broken = make_task(name="broken", **schedule)
    for _ in range(3):
        ledger.reconcile(GRACE)
    claim(recorder)

    failed = Run.objects.get(periodic_task=broken)  # one run for the error, not one per pass
    assert (failed.status, failed.reason, failed.error) == (
        Run.Status.FAILED, "invalid schedule", error
    )
    assert caplog.messages.count(f"cannot plan periodic task 'broken': {error}") == 1
    _assert_unaffected(good, good_run, recorder)


def test_an_interval_edited_to_zero_replaces_the_pending_run_by_a_failed_one(
    make_task, recorder, caplog
):
    good, good_run = _good(make_task)
    edited = make_task(every=3600, name="edited")
    ledger.reconcile(GRACE)
    planned = Run.objects.pending().get(periodic_task=edited)
    IntervalSchedule.objects.filter(pk=edited.interval_id).update(every=0)  # as raw SQL would
    ledger.reconcile(GRACE)
    claim(recorder)

    planned.refresh_from_db()
    assert (planned.status, planned.reason) == (Run.Status.CANCELLED, "schedule edited")
    failed = Run.objects.get(periodic_task=edited, status=Run.Status.FAILED)
    assert (failed.reason, failed.error) == (
        "invalid schedule", "interval must be positive, got 0 seconds"
    )
    assert "cannot plan periodic task 'edited': interval must be positive, got 0 seconds" in (
        caplog.messages
    )
    _assert_unaffected(good, good_run, recorder)


@pytest.mark.parametrize("kind", ["interval", "crontab", "clocked"])
def test_a_schedule_row_deleted_under_a_due_run_cancels_it(make_task, recorder, caplog, kind):
    """django-celery-beat's schedule foreign keys cascade: the task goes with its schedule row."""
    good, good_run = _good(make_task)
    schedule = {
        "interval": {"every": 30},
        "crontab": {"cron": "*/5 * * * *"},
        "clocked": {"clocked": ledger.database_now() + timedelta(hours=1)},
    }[kind]
    victim = make_task(name="victim", **schedule)
    victim_run = make_due(victim)
    getattr(victim, kind).delete()

    claim(recorder)

    victim_run.refresh_from_db()
    assert (victim_run.status, victim_run.reason, victim_run.periodic_task_id) == (
        Run.Status.CANCELLED, "periodic task deleted", None
    )
    assert victim_run.periodic_task_name == "victim"  # the audit keeps the name
    assert f"cancelled victim (task id {victim_run.task_id}): periodic task deleted" in (
        caplog.messages
    )
    _assert_unaffected(good, good_run, recorder)


def test_a_task_whose_schedule_link_is_removed_by_sql_fails_one_run(make_task, recorder, caplog):
    good, good_run = _good(make_task)
    orphan = make_task(every=3600, name="orphan")
    ledger.reconcile(GRACE)
    planned = Run.objects.pending().get(periodic_task=orphan)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_celery_beat_periodictask SET interval_id = NULL WHERE id = %s",
            [orphan.pk],
        )
    ledger.reconcile(GRACE)
    claim(recorder)

    planned.refresh_from_db()
    assert (planned.status, planned.reason) == (Run.Status.CANCELLED, "schedule edited")
    error = "periodic task 'orphan' has no schedule (interval, crontab, ...)"
    failed = Run.objects.get(periodic_task=orphan, status=Run.Status.FAILED)
    assert (failed.reason, failed.error) == ("invalid schedule", error)
    assert f"cannot plan periodic task 'orphan': {error}" in caplog.messages
    _assert_unaffected(good, good_run, recorder)


def test_years_of_missed_slots_under_catch_up_are_accounted_for_in_one_claim(
    make_task, recorder, caplog
):
    """Two years of a 1 s interval: one claim records them (1000 rows), the last 3 are replayed."""
    good, good_run = _good(make_task)
    now = ledger.database_now()
    s0 = now.replace(microsecond=0) - timedelta(days=730)
    huge = make_task(every=1, start_time=s0, name="huge")
    TaskPolicy.objects.create(
        periodic_task=huge, misfire_policy=TaskPolicy.Misfire.CATCH_UP, catch_up_limit=3,
        misfire_grace_seconds=1,
    )
    ledger.reconcile(GRACE)
    Run.objects.pending().filter(periodic_task=huge).update(
        scheduled_for=s0, task_id=slots.task_id_for(huge.pk, s0)
    )

    began = time.monotonic()
    claim(recorder)
    first_claim = time.monotonic() - began
    _assert_unaffected(good, good_run, recorder)
    claims = 1
    while [d for d in claim(recorder) if d.status != Run.Status.PENDING]:
        claims += 1

    rows = list(Run.objects.filter(periodic_task=huge).order_by("scheduled_for"))
    one = timedelta(seconds=1)
    for row, following in zip(rows, rows[1:]):  # the whole grid, no slot twice or left out
        assert following.scheduled_for == row.scheduled_for + row.slots * one
    claimed_at = rows[0].finished_at
    first = [r for r in rows if r.status == Run.Status.MISSED and r.finished_at == claimed_at]
    assert len(first) == ledger.MISSED_ROWS_LIMIT + 1  # the run itself and 1000 rows
    total = sum(r.slots for r in first)
    assert total >= 730 * 86400 - 10
    # the first claim stopped at the 3 most recent slots past the grace, planned for replay (by
    # the time the next claim runs, newer slots may have pushed the oldest out: stateless rule)
    replay_from = rows[len(first)].scheduled_for
    assert replay_from == s0 + total * one
    cutoff = claimed_at - timedelta(seconds=1)
    assert cutoff - 3 * one < replay_from <= cutoff - 2 * one
    assert [r for r in rows if r.status not in ("missed", "dispatched", "pending")] == []
    late = (claimed_at - s0).total_seconds()
    assert {r.reason for r in first} == {f"misfire: catch_up policy, {late:.3f} s late (grace 1 s)"}
    assert f"misfire of 'huge': {total} slots from {s0} recorded missed (catch_up policy)" in (
        caplog.messages
    )
    assert rows[-1].status == Run.Status.PENDING
    assert rows[-1].scheduled_for > ledger.database_now() - timedelta(seconds=2)
    print(f"first claim {first_claim:.2f} s, {claims} claims in all, {len(rows)} rows")
    assert claims <= 20  # not one claim per 10,000 slots (6,307 claims)


def test_an_expired_task_is_disabled_by_name_and_the_others_planned(make_task, caplog):
    good = make_task(every=60, name="good")
    expired = make_task(every=60, name="expired-yesterday")
    PeriodicTask.objects.filter(pk=expired.pk).update(
        expires=ledger.database_now() - timedelta(days=1)
    )
    Run.objects.filter(periodic_task=expired).delete()

    ledger.reconcile(GRACE)

    expired.refresh_from_db()
    assert expired.enabled is False
    assert Run.objects.filter(periodic_task=expired).count() == 0
    assert Run.objects.pending().filter(periodic_task=good).count() == 1
    assert [m for m in caplog.messages if m.startswith("disabled")] == [
        "disabled 1 periodic tasks whose schedule is over (expired, or its one run done):"
        " 'expired-yesterday'"
    ]
