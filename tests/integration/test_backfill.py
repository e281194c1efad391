"""Backfill and run-now commands on real PostgreSQL: slots, idempotency, order, errors."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from scheduling import ledger, slots
from scheduling.exceptions import BackfillRejected
from scheduling.models import Run, TaskHistory, TaskPolicy
from tests.conftest import utc
from tests.integration.conftest import claim

pytestmark = pytest.mark.django_db(transaction=True)

START = utc(2026, 1, 5, 10, 0)


def _backfill(task, *args: str) -> str:
    out = StringIO()
    call_command("backfill", task.name, *args, stdout=out)
    return out.getvalue()


def test_backfill_creates_one_run_per_slot_once_and_replicas_dispatch_them_in_order(
    make_task, recorder
):
    task = make_task(every=60, start_time=START)
    first = _backfill(task, "--since", "2026-01-05T10:00:00Z", "--until", "2026-01-05T10:10:00Z",
                      "--requested-by", "ops")
    again = _backfill(
        task, "--since", "2026-01-05T10:00:00+00:00", "--until", "2026-01-05T10:10:00"
    )

    expected = [START + timedelta(minutes=i) for i in range(10)]
    runs = list(Run.objects.filter(trigger=Run.Trigger.BACKFILL).order_by("scheduled_for"))
    assert [r.scheduled_for for r in runs] == expected
    assert {(r.status, r.requested_by) for r in runs} == {(Run.Status.PENDING, "ops")}
    assert [r.task_id for r in runs] == [
        slots.task_id_for(task.pk, s, "backfill") for s in expected
    ]
    assert first.splitlines()[-1].endswith("10 slots, 10 new runs, 0 already there")
    assert again.splitlines()[-1].endswith("10 slots, 0 new runs, 10 already there")

    claim(recorder)
    assert recorder.task_ids == [r.task_id for r in runs]
    assert set(Run.objects.filter(trigger=Run.Trigger.BACKFILL).values_list("status", flat=True)) \
        == {Run.Status.DISPATCHED}
    assert Run.objects.pending().scheduled().filter(periodic_task=task).count() == 0  # untouched


def test_backfill_reports_progress_per_chunk(make_task):
    task = make_task(every=1, start_time=START)
    seen: list[ledger.BackfillProgress] = []
    total = ledger.backfill(
        task, START, START + timedelta(seconds=25), chunk_size=10, progress=seen.append
    )
    assert [(p.slots, p.created) for p in seen] == [(10, 10), (20, 20), (25, 25)]
    assert [round(p.fraction, 2) for p in seen] == [0.36, 0.76, 0.96]
    assert (total.slots, total.created, total.fraction) == (25, 25, 1.0)


def test_backfill_of_a_skip_task_skips_runs_whose_predecessor_is_unfinished(make_task, recorder):
    task = make_task(every=60, start_time=START)
    TaskPolicy.objects.create(periodic_task=task, overlap_policy=TaskPolicy.Overlap.SKIP)
    ledger.backfill(task, START, START + timedelta(minutes=3))
    claim(recorder)
    statuses = list(Run.objects.filter(trigger=Run.Trigger.BACKFILL)
                    .order_by("scheduled_for").values_list("status", flat=True))
    assert statuses == [Run.Status.DISPATCHED, Run.Status.SKIPPED, Run.Status.SKIPPED]


@pytest.mark.parametrize(
    ("since", "until", "message"),
    [
        ("2026-01-05T10:10:00Z", "2026-01-05T10:00:00Z",
         "^empty range: since 2026-01-05 10:10:00.000 UTC is not before until$"),
        ("2026-01-05T10:00:00Z", "2999-01-01T00:00:00Z",
         r"^until 2999-01-01 00:00:00.000 UTC is in the future \(database clock "
         r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC\)$"),
        ("yesterday", "2026-01-05T10:00:00Z", "not an ISO 8601 date-time: 'yesterday'"),
    ],
)
def test_backfill_rejects_bad_ranges(make_task, since, until, message):
    task = make_task(every=60)
    with pytest.raises(CommandError, match=message):
        _backfill(task, "--since", since, "--until", until)
    assert Run.objects.count() == 0


def test_backfill_rejected_is_a_scheduling_error(make_task):
    with pytest.raises(BackfillRejected):
        ledger.backfill(make_task(every=60), START, START)


def test_run_now_command_by_name_or_id_records_who_asked(make_task, recorder):
    task = make_task(every=3600, name="nightly")
    out = StringIO()
    call_command("run_now", "nightly", "--requested-by", "alice", stdout=out)
    call_command("run_now", str(task.pk), stdout=out)
    manual = list(Run.objects.filter(trigger=Run.Trigger.MANUAL).order_by("pk"))
    assert [r.requested_by for r in manual][0] == "alice"
    assert manual[1].requested_by.startswith("command:")
    assert "manual run" in out.getvalue() and "'nightly' queued" in out.getvalue()
    claim(recorder)
    claim(recorder)
    assert recorder.task_ids == [r.task_id for r in manual]
    with pytest.raises(CommandError, match="no periodic task named 'missing'"):
        call_command("run_now", "missing")


def _warned(task, since, until) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("backfill", task.name, "--since", since, "--until", until, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_range_without_a_slot_of_the_task_is_a_warning_saying_why(make_task):
    hourly = make_task(every=3600, start_time=START, name="hourly")
    assert _warned(hourly, "2026-01-05T10:10:00Z", "2026-01-05T10:40:00Z") == ("", (
        "warning: backfill of 'hourly' from 2026-01-05 10:10:00 UTC until 2026-01-05 10:40:00 "
        "UTC: no slot of the task falls in the range: the range (1800 s) is shorter than its "
        "interval (3600 s)\n"
    ))
    assert _warned(hourly, "2026-01-04T10:00:00Z", "2026-01-05T10:00:00Z")[1] == (
        "warning: backfill of 'hourly' from 2026-01-04 10:00:00 UTC until 2026-01-05 10:00:00 "
        "UTC: no slot of the task falls in the range: the range ends before its start time "
        "(2026-01-05 10:00:00 UTC)\n"
    )
    assert Run.objects.count() == 0


def test_a_range_that_ends_before_the_task_existed_says_so(make_task):
    task = make_task(every=60, name="new")
    created = ledger.database_now() - timedelta(hours=1)
    TaskHistory.objects.filter(periodic_task_id=task.pk).update(changed_at=created)
    since, until = created - timedelta(days=2), created - timedelta(days=1)
    assert ledger.backfill(task, since, until).slots == 0
    assert ledger.no_slot_reason(task, since, until) == (
        "no slot of the task falls in the range: the range ends before the task existed "
        f"(created {created:%Y-%m-%d %H:%M:%S} UTC)"
    )


def test_a_chunk_of_no_slot_is_refused(make_task):
    task = make_task(every=60)
    with pytest.raises(CommandError, match="^--chunk must be 1 or more, got 0$"):
        _backfill(task, "--since", "2026-01-05T10:00Z", "--until", "2026-01-05T11:00Z",
                  "--chunk", "0")
    assert Run.objects.count() == 0
