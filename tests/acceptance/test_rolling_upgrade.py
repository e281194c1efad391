"""A rolling upgrade (invariant 11): replicas and a worker of the previous release and of today
claim and execute side by side on one database without doubling or losing a slot.

Two replicas and a worker of the previous release (a git worktree of its commit, run with this
session's Python: ``tests.acceptance.previous_release``) run on a database its own ``migrate``
built; then today's ``migrate`` runs on that database while they keep running (docs/operating.md,
"Upgrading": ``migrate`` after installing the new release; here before its processes start), and
two replicas and a worker of today's code start beside them. All run together for ``SIDE_BY_SIDE`` seconds; half way through
one old replica and the old worker are killed with SIGKILL. Then the old replica left stops,
today's replicas a little later, and today's worker finishes what was dispatched.

Checked, per interval task (slots ``start_time + k * every``) and for the ``* * * * *`` crontab
(every minute boundary after it was created): every slot due at least ``MARGIN`` before the
last replica was told to stop has exactly one run, no run is off those slots or past the stop,
and each run was executed exactly once by the workers' own log (one execution file for the old
and the new worker). The one outcome the contract allows besides (invariants 3 and 9): a run
whose worker was killed inside its body, closed "worker lost" (policy fail, the default), with
its start in the log and no end.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.deployment import ROOT, Deployment, wait_until
from tests.acceptance.previous_release import (
    IMPORTS_LOGGED,
    checkout,
    manage_at,
    old_processes,
    query,
    scheduling_imported_from,
)
from tests.acceptance.test_migrations import new_database  # noqa: F401  (a fixture)
from tests.acceptance.test_upgrade import FAST
from tools.processes import Processes

# Old and new code claiming side by side on one schema, not the broker: the first pass of
# .ci/run covers it.
pytestmark = [pytest.mark.acceptance, pytest.mark.once]

#: Seconds the replicas and workers of both releases run together (the kill half way).
SIDE_BY_SIDE = 60
#: A slot due this long before the last replica was told to stop must have its run.
MARGIN = timedelta(seconds=3)
#: Interval tasks: name -> seconds.
INTERVALS = {f"every-{every}s-{i}": every for i in range(3) for every in (1, 2)}
CRON = "every-minute"
#: ``FAST``, and a run whose worker was killed is acted on after 5 s, not 60.
BOUNDS = {**FAST, "SCHEDULING_WORKER_LOST_AFTER": "5"}
#: Written by the previous release's code once its replicas run; prints the anchor and when.
SEED = """
import json
from datetime import timedelta
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask
from scheduling.ledger import database_now
now = database_now()
start = (now + timedelta(seconds=3)).replace(microsecond=0)
for name, every in INTERVALS.items():
    schedule, _ = IntervalSchedule.objects.get_or_create(every=every, period='seconds')
    PeriodicTask.objects.create(name=name, task='project.tasks.record', interval=schedule,
                                start_time=start, kwargs='{"log_start": true}')
cron, _ = CrontabSchedule.objects.get_or_create(
    minute='*', hour='*', day_of_month='*', month_of_year='*', day_of_week='*', timezone='UTC')
PeriodicTask.objects.create(name=CRON, task='project.tasks.record', crontab=cron,
                            kwargs='{"log_start": true}')
print(json.dumps({"start": start.isoformat(), "created": database_now().isoformat()}))
""".replace("INTERVALS", repr(INTERVALS)).replace("CRON", repr(CRON))
OLD = ("old-replica-1", "old-replica-2", "old-worker")
NEW = ("new-replica-1", "new-replica-2", "new-worker")


def run_side_by_side(url: str, folder: Path, old: Processes, head: Deployment) -> dict[str, str]:
    """Run both releases as the module says; return the seed's instants and the window's."""
    old.start_beat("old-replica-1")
    old.start_beat("old-replica-2")
    old.start_worker("old-worker", concurrency=2)
    old.wait_ready(timeout=120)
    seeded = json.loads(manage_at(folder, url, "shell", "--verbosity", "0", "-c", SEED))
    manage_at(ROOT, url, "migrate", "--no-input", "--verbosity", "0")
    for name in NEW[:2]:
        head.start_beat(name, **IMPORTS_LOGGED)
    head.start_worker("new-worker", concurrency=2, **IMPORTS_LOGGED)
    head.wait_ready(timeout=120)
    together = time.monotonic()
    time.sleep(SIDE_BY_SIDE / 2)
    old.kill("old-replica-1")
    old.kill("old-worker")
    time.sleep(max(0.0, together + SIDE_BY_SIDE - time.monotonic()))
    assert [old.alive("old-replica-2"), *map(head.alive, NEW)] == [True] * 4
    old.stop()
    time.sleep(2)  # today's replicas alone
    seeded["last_alive"] = database_now(url)
    finish(url, head, seeded)
    return seeded


#: Runs not settled: unfinished, or due and still pending.
UNSETTLED = (
    "SELECT count(*) FROM scheduling_run WHERE scheduled_for <= %s AND (status IN"
    " ('dispatched', 'running', 'retrying') OR (status = 'pending' AND due_at <= %s))"
)


def finish(url: str, head: Deployment, seeded: dict[str, str]) -> None:
    """Let today's replicas settle every run due by ``last_alive`` (a re-publish of what the
    killed worker held, its runs closed), stop them, and let today's worker finish the rest."""
    until = seeded["last_alive"]
    wait_until(lambda: query(url, UNSETTLED, [until, until]) == [(0,)], timeout=120, interval=0.2)
    head.stop(*NEW[:2])
    seeded["end"] = database_now(url)
    unfinished = "SELECT count(*) FROM scheduling_run WHERE status IN ('dispatched', 'running'," \
                 " 'retrying')"
    wait_until(lambda: query(url, unfinished) == [(0,)], timeout=120, interval=0.2)
    head.stop("new-worker", warm=True)


def database_now(url: str) -> str:
    return query(url, "SELECT clock_timestamp()")[0][0].isoformat()


def slots_of(url: str) -> dict[str, list[datetime]]:
    """Task name -> the slots of its runs that left pending (cancelled ones aside), in order."""
    found: dict[str, list[datetime]] = {}
    for name, slot in query(url, "SELECT periodic_task_name, scheduled_for FROM scheduling_run"
                                 " WHERE status NOT IN ('pending', 'cancelled') ORDER BY 2"):
        found.setdefault(name, []).append(slot)
    return found


def expected_slots(seeded: dict[str, str]) -> dict[str, tuple[list[datetime], list[datetime]]]:
    """Task name -> (slots that must have a run, slots that may have one), in order."""
    start, created = (datetime.fromisoformat(seeded[k]) for k in ("start", "created"))
    surely = datetime.fromisoformat(seeded["last_alive"]) - MARGIN
    end = datetime.fromisoformat(seeded["end"])
    grids = {name: [start + timedelta(seconds=every * k) for k in range(400)]
             for name, every in INTERVALS.items()}
    minute = created.replace(second=0, microsecond=0)
    grids[CRON] = [minute + timedelta(minutes=k) for k in range(1, 10)]
    return {name: ([s for s in grid if s <= surely], [s for s in grid if s <= end])
            for name, grid in grids.items()}


def assert_every_slot_once(url: str, seeded: dict[str, str]) -> int:
    """Assert each task's runs are its due slots, once each (see the module); return how many."""
    found = slots_of(url)
    assert sorted(found) == sorted([*INTERVALS, CRON])
    for name, (surely, possibly) in expected_slots(seeded).items():
        slots = found[name]
        assert len(slots) == len(set(slots)), f"{name}: a slot with two runs"
        assert slots[: len(surely)] == surely, f"{name}: slots missing"
        assert set(slots) <= set(possibly), f"{name}: runs off its slots or past the stop"
    assert len(expected_slots(seeded)[CRON][0]) >= 1  # the window spans a minute boundary
    return sum(len(slots) for slots in found.values())


#: The outcome allowed besides one execution (see the module).
WORKER_LOST = "worker lost"


def assert_executed_once(url: str, head: Deployment) -> dict[str, int]:
    """Assert every run that left pending was executed once (the workers' own log) or closed
    "worker lost" inside its body; return the figures."""
    runs = dict(query(url, "SELECT task_id, status || ': ' || reason FROM scheduling_run"
                           " WHERE status NOT IN ('pending', 'cancelled')"))
    ends = Counter(e["task_id"] for e in head.executions())
    starts = Counter(e["task_id"] for e in head.executions("start"))
    lost_in_body = {task_id for task_id, outcome in runs.items()
                    if outcome == f"failed: {WORKER_LOST}" and starts[task_id] and not ends[task_id]}
    never = {task_id: outcome for task_id, outcome in runs.items()
             if ends[task_id] == 0 and task_id not in lost_in_body}
    assert never == {}, "in the ledger, never executed"
    twice = [task_id for task_id, n in ends.items() if n > 1]
    assert twice == [], "executed more than once"
    assert sorted(set(ends) - set(runs)) == [], "executed, not in the ledger"
    return {"runs": len(runs), "executions": ends.total(), "duplicates": len(twice), "lost": len(never),
            "closed worker lost inside the body": len(lost_in_body)}


@pytest.mark.timeout(900)
def test_replicas_of_the_previous_release_and_of_today_run_every_slot_once_side_by_side(
    tmp_path, new_database  # noqa: F811
):
    started = time.monotonic()
    url = new_database()
    head = Deployment(tmp_path / "processes", DATABASE_URL=url, **BOUNDS)
    with checkout(tmp_path / "previous") as folder:
        manage_at(folder, url, "migrate", "--no-input", "--verbosity", "0")
        old = old_processes(folder, head)
        try:
            seeded = run_side_by_side(url, folder, old, head)
        finally:
            old.stop()
            head.stop()
    for name in OLD:
        assert scheduling_imported_from(old, name) == {folder}, name
    for name in NEW:
        assert scheduling_imported_from(head, name) == {ROOT}, name

    slots = assert_every_slot_once(url, seeded)
    figures = assert_executed_once(url, head)
    claimed = Counter(name.split("-")[0] for (name,) in query(
        url, "SELECT claimed_by FROM scheduling_run WHERE claimed_by <> ''"))
    workers = Counter(name.split("-")[0] for (name,) in query(
        url, "SELECT worker FROM scheduling_run WHERE worker <> ''"))
    print(f"slots {slots}, {figures}, claimed by {dict(claimed)}, executed by {dict(workers)},"
          f" window {seeded}, wall time {time.monotonic() - started:.0f} s")
    assert figures["runs"] == slots
    assert (claimed["old"] > 0, claimed["new"] > 0) == (True, True)
    assert (workers["old"] > 0, workers["new"] > 0) == (True, True)
