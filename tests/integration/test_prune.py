"""Issue 7, acceptance 4: prune removes exactly what it says on a seeded ledger; a dry run nothing.

The expected survivors are computed here from the seeded rows (plain Python over the rule:
finished, finished before the cut-off, not among the task's last N finished runs), not through
the code under test.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from datetime import timedelta
from io import StringIO
from unittest.mock import patch

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from scheduling import cadences, ledger
from scheduling.builtin_prune import BuiltinPrune
from scheduling.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)
#: Every status but buffered (at most one buffered run per task: a constraint; never final).
STATUSES = [status for status in Run.Status if status != Run.Status.BUFFERED]


def _seed(make_task) -> list[Run]:
    """300 runs of three tasks and one deleted task: every status, ages 0-60 days."""
    rng = random.Random(7)
    now = ledger.database_now()
    tasks = [make_task(every=60, name=f"prune-{i}") for i in range(3)]
    runs = []
    for i in range(300):
        task = tasks[i % 4] if i % 4 < 3 else None
        status = STATUSES[rng.randrange(len(STATUSES))]
        # Whole days and a half, far from the 30-day cut-off, so the clock's progress is moot.
        # "prune-2" ran only 31-60 days ago: --keep-last decides what it keeps.
        oldest = 31 if i % 4 == 2 else 0
        slot = now - DAY * rng.randrange(oldest, 60) - DAY / 2 - timedelta(microseconds=i)
        finished = status in Run.FINAL_STATUSES
        runs.append(Run(
            periodic_task=task,
            periodic_task_name=task.name if task else "deleted-task",
            task="project.tasks.record",
            scheduled_for=slot,
            trigger=Run.Trigger.MANUAL if status == Run.Status.PENDING else Run.Trigger.SCHEDULE,
            status=status,
            task_id=str(uuid.uuid4()),
            # Most finish soon after their slot; some 40 days later; a few have no finished_at.
            finished_at=(None if not finished or i % 17 == 0
                         else slot + (DAY * 40 if i % 5 == 0 else timedelta(seconds=3))),
        ))
    return Run.objects.bulk_create(runs)


def _expected_deleted(runs: list[Run], older_than: timedelta, keep_last: int) -> set[int]:
    cutoff = ledger.database_now() - older_than
    finished = [r for r in runs if r.status in Run.FINAL_STATUSES]
    kept: set[int] = set()
    for name in {r.periodic_task_name for r in finished}:
        mine = sorted((r for r in finished if r.periodic_task_name == name),
                      key=lambda r: (r.scheduled_for, r.pk), reverse=True)
        kept |= {r.pk for r in mine[:keep_last]}
    return {
        r.pk for r in finished
        if (r.finished_at or r.scheduled_for) < cutoff and r.pk not in kept
    }


def _prune(*args: str) -> tuple[dict[str, int], str]:
    out = StringIO()
    call_command("scheduling_prune", *args, stdout=out)
    lines = out.getvalue().splitlines()
    counts = {}
    for line in lines[1:-1]:
        status, n = line.split()
        counts[status] = int(n)
    return counts, lines[-1]


def _ids() -> set[int]:
    return set(Run.objects.values_list("pk", flat=True))


def test_prune_deletes_exactly_the_old_finished_runs_beyond_the_last_n_and_dry_run_nothing(
    make_task
):
    runs = _seed(make_task)
    deleted = _expected_deleted(runs, timedelta(days=30), keep_last=3)
    by_status = Counter(r.status for r in runs if r.pk in deleted)
    # A real test: every final status goes, and --keep-last keeps some old runs.
    assert len(deleted) > 50 and len(by_status) == len(Run.FINAL_STATUSES)
    assert len(_expected_deleted(runs, timedelta(days=30), keep_last=0) - deleted) == 3
    before = _ids()

    dry, dry_total = _prune("--older-than", "30d", "--keep-last", "3", "--dry-run")
    assert _ids() == before
    assert dry == dict(by_status)
    assert dry_total == f"would delete {len(deleted)} runs"

    done, total = _prune("--older-than", "30d", "--keep-last", "3", "--batch-size", "7")
    assert _ids() == before - deleted
    assert done == dry
    assert total == f"deleted {len(deleted)} runs"
    unfinished = {r.pk for r in runs if r.status not in Run.FINAL_STATUSES}
    assert unfinished <= _ids()

    assert _prune("--older-than", "30d", "--keep-last", "3") == ({}, "deleted 0 runs")


def test_prune_deletes_a_pauses_skipped_run_and_keeps_the_pause(make_task):
    task = make_task(every=3600)
    pause = ledger.pause(task, by="ops", why="maintenance")
    run = Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, task_id="paused-run",
        scheduled_for=ledger.database_now() - timedelta(days=40), status=Run.Status.SKIPPED,
        finished_at=ledger.database_now() - timedelta(days=40),
    )
    pause.__class__.objects.filter(pk=pause.pk).update(run=run)
    ledger.resume(task, by="ops")  # completes the run's row: its slots, finished now
    Run.objects.filter(pk=run.pk).update(finished_at=ledger.database_now() - timedelta(days=40))
    assert _prune("--older-than", "30d") == ({"skipped": 1}, "deleted 1 runs")
    pause.refresh_from_db()
    assert (pause.run_id, pause.paused_by, pause.why) == (None, "ops", "maintenance")
    assert not Run.objects.filter(pk=run.pk).exists()


def test_prune_without_keep_last_and_in_hours(make_task):
    runs = _seed(make_task)
    deleted = _expected_deleted(runs, timedelta(hours=240), keep_last=0)
    before = _ids()
    counts, total = _prune("--older-than", "240h")
    assert _ids() == before - deleted
    assert sum(counts.values()) == len(deleted) and total == f"deleted {len(deleted)} runs"


def test_builtin_prune_deletes_the_same_in_small_batches_per_step(make_task):
    runs = _seed(make_task)
    deleted = _expected_deleted(runs, timedelta(days=30), keep_last=2)
    before = _ids()
    pruner = BuiltinPrune()
    with override_settings(SCHEDULING_PRUNE_OLDER_THAN="30d", SCHEDULING_PRUNE_KEEP_LAST=2), \
            patch.multiple(cadences, PRUNE_BATCH_SIZE=10):
        sizes = []
        for _ in range(len(deleted) // 10 + 1):
            left = len(_ids())
            pruner.step()
            sizes.append(left - len(_ids()))
        assert _ids() == before - deleted
        assert sizes == [10] * (len(deleted) // 10) + [len(deleted) % 10]
        pruner.step()  # the pass is over; the next one waits for cadences.PRUNE_INTERVAL
        assert _ids() == before - deleted


def test_builtin_prune_is_off_by_default(make_task):
    _seed(make_task)
    before = _ids()
    BuiltinPrune().step()
    assert _ids() == before


def test_prune_waits_for_no_claim_and_skips_a_locked_row(make_task, raw_connection):
    """A claim holds its pending runs and task rows; a guard holds a finished run: prune goes on."""
    runs = _seed(make_task)
    deleted = _expected_deleted(runs, timedelta(days=30), keep_last=0)
    locked = min(deleted)
    with raw_connection.transaction():
        raw_connection.execute(
            "SELECT id FROM scheduling_run WHERE status = 'pending' OR id = %s FOR UPDATE",
            [locked],
        )
        raw_connection.execute("SELECT id FROM django_celery_beat_periodictask FOR UPDATE")
        started = time.monotonic()
        counts, _ = _prune("--older-than", "30d")
        assert time.monotonic() - started < 5
    assert _ids() == {r.pk for r in runs} - deleted | {locked}
    assert sum(counts.values()) == len(deleted) - 1


def test_a_prune_batch_commits_without_waiting_for_its_wal_flush(make_task):
    """Asynchronous commit for the batch's own transaction only: the setting is read on the same
    server session right after the DELETE, and again after the commit."""
    runs = _seed(make_task)
    deleted = _expected_deleted(runs, timedelta(days=30), keep_last=0)
    seen = []

    def after_delete(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().startswith("DELETE"):
            raw = context["connection"].connection  # the psycopg session, past Django's wrappers
            seen.append(raw.execute("SHOW synchronous_commit").fetchone()[0])
        return result

    plan = ledger.prune_plan(timedelta(days=30))
    with connection.execute_wrapper(after_delete):
        counts, _ = ledger.prune_batch(plan, 0, 5)
    assert seen == ["off"]
    assert sum(counts.values()) == 5 and len(deleted) > 5
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def test_prune_command_rejects_a_bad_duration():
    with pytest.raises(CommandError, match="not a duration"):
        call_command("scheduling_prune", "--older-than", "30 days")


def test_builtin_prune_that_fails_waits_for_the_next_pass(make_task, settings, caplog):
    """A failing pass (here an invalid keep-last) is logged once, not retried every tick."""
    runs = _seed(make_task)
    settings.SCHEDULING_PRUNE_OLDER_THAN = "30d"
    settings.SCHEDULING_PRUNE_KEEP_LAST = -1
    pruner = BuiltinPrune()
    pruner.step()
    pruner.step()
    assert [r.message for r in caplog.records if r.name == "scheduling.builtin_prune"] == [
        "built-in prune failed"
    ]
    assert _ids() == {r.pk for r in runs}


def test_a_replica_prunes_in_batches_on_idle_ticks(monkeypatch, make_task, settings):
    from project.celery import app
    from scheduling.schedulers import LedgerScheduler

    settings.SCHEDULING_PRUNE_OLDER_THAN = "30d"
    monkeypatch.setattr(cadences, "PRUNE_BATCH_SIZE", 2)
    task = make_task(every=3600, name="hourly")
    now = ledger.database_now()
    old = [
        Run.objects.create(
            periodic_task=task, periodic_task_name=task.name, task=task.task,
            scheduled_for=now - DAY * (40 + i), status=Run.Status.SUCCEEDED,
            task_id=str(uuid.uuid4()), finished_at=now - DAY * (40 + i),
        ).pk
        for i in range(3)
    ]
    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # plans the next slot, an hour ahead; deletes the first batch
    assert len(set(old) & _ids()) == 1
    scheduler.tick()
    assert set(old) & _ids() == set()
    assert Run.objects.pending().filter(periodic_task=task).count() == 1


def test_a_busy_replica_prunes_within_a_tenth_of_its_time(monkeypatch, make_task, settings):
    """Busy steps (a run due now) delete a batch only after the prune rested nine times as long
    as its last batch took; an idle step deletes whenever a pass is under way."""
    runs = _seed(make_task)
    deleted = _expected_deleted(runs, timedelta(days=30), keep_last=0)
    settings.SCHEDULING_PRUNE_OLDER_THAN = "30d"
    monkeypatch.setattr(cadences, "PRUNE_BATCH_SIZE", 10)
    calls = iter(range(1, 10_000))  # each reading of the clock one unit later: a batch takes 1
    pruner = BuiltinPrune(clock=lambda: next(calls))
    sizes = []
    for _ in range(28):
        left = len(_ids())
        pruner.step(busy=True)
        sizes.append(left - len(_ids()))
    # Batches at the 1st, 10th, 19th and 28th busy step: 1 unit of work, then 9 of rest. A unit is
    # far over BUSY_BATCH_SECONDS: each busy batch is the smallest, 10 / 25 -> 1.
    assert sizes == ([1] + [0] * 8) * 3 + [1]
    left = len(_ids())
    pruner.step()  # idle: no rest
    assert left - len(_ids()) == 10
    assert len(deleted) > 50  # the pass was not over: every batch was full


def test_a_busy_replicas_batch_is_sized_to_take_about_two_milliseconds(
    monkeypatch, make_task, settings
):
    """A busy batch's size is the last one's times BUSY_BATCH_SECONDS over the time it took, at
    most double, between cadences.PRUNE_BATCH_SIZE / 25 and cadences.PRUNE_BATCH_SIZE; the
    batch that plans the pass and an idle one are not measured; an idle batch is full size."""
    runs = _seed(make_task)
    deleted = _expected_deleted(runs, timedelta(days=30), keep_last=0)
    settings.SCHEDULING_PRUNE_OLDER_THAN = "30d"
    monkeypatch.setattr(cadences, "PRUNE_BATCH_SIZE", 40)  # the smallest busy batch: 40 // 25 -> 1
    took = [0.005, 0.001, 0.001, 0.0001, 0.008, 0.001, 0.004]  # seconds, one per busy batch
    readings = []
    for i, seconds in enumerate(took):  # each step reads the clock before and after its batch
        readings += [100.0 * i, 100.0 * i + seconds]
    readings += [1000.0, 1000.0]  # the idle step
    pruner = BuiltinPrune(clock=iter(readings).__next__)
    sizes = []
    for _ in took:
        left = len(_ids())
        pruner.step(busy=True)
        sizes.append(left - len(_ids()))
    left = len(_ids())
    pruner.step()
    sizes.append(left - len(_ids()))
    # 1 (planned: not measured), 1 -> 2 (1 ms: double), 2 -> 4 (1 ms), 4 -> 8 (0.1 ms: at most
    # double), 8 -> 2 (8 ms), 2 -> 4 (1 ms), 4 -> 2 (4 ms); idle: 40.
    assert sizes == [1, 1, 2, 4, 8, 2, 4, 40]
    assert len(deleted) > sum(sizes)  # every batch was full: the pass went on


def test_a_replica_with_a_run_due_at_every_tick_prunes_too(monkeypatch, make_task, settings):
    """The benchmark's day ledger: at 1,000 runs/s no tick was idle and nothing was pruned."""
    from project.celery import app
    from scheduling.schedulers import LedgerScheduler

    settings.SCHEDULING_PRUNE_OLDER_THAN = "30d"
    monkeypatch.setattr(cadences, "PRUNE_BATCH_SIZE", 2)
    monkeypatch.setattr(cadences, "BATCH_SIZE", 1)
    now = ledger.database_now()
    tasks = [make_task(every=3600, name=f"due-{i}", start_time=now - timedelta(seconds=1))
             for i in range(3)]
    old = [
        Run.objects.create(
            periodic_task=tasks[0], periodic_task_name=tasks[0].name, task=tasks[0].task,
            scheduled_for=now - DAY * (40 + i), status=Run.Status.SUCCEEDED,
            task_id=str(uuid.uuid4()), finished_at=now - DAY * (40 + i),
        ).pk
        for i in range(3)
    ]
    scheduler = LedgerScheduler(app=app)
    assert scheduler.tick() == 0.0  # it claimed one of the due runs: more may be due
    assert Run.objects.filter(status=Run.Status.DISPATCHED).count() == 1
    assert len(set(old) & _ids()) == 2  # and deleted a busy batch after the claim: the smallest, 1


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [("--keep-last", "-1", "^--keep-last must be 0 or more, got -1$"),
     ("--batch-size", "0", "^--batch-size must be 1 or more, got 0$")],
)
def test_prune_command_names_its_options_in_its_errors(option, value, error):
    with pytest.raises(CommandError, match=error):
        call_command("scheduling_prune", "--older-than", "30d", option, value)


def test_prune_command_says_finished_once():
    out = StringIO()
    call_command("scheduling_prune", "--older-than", "30d", "--dry-run", stdout=out)
    assert out.getvalue().startswith("runs that finished before "), out.getvalue()
