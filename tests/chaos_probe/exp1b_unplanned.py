"""Experiment 1b: a replica SIGKILLed between publish and commit, while the worker already runs the
message, leaves the periodic task with no pending run until the next reconcile (up to 60 s).

    .venv/bin/python -m tests.chaos_probe.exp1b_unplanned <dbname> <workdir>

beatB runs normally; beatA sleeps 3 s after publishing (test hook). When beatA logs its pause it is
SIGKILLed. The worker's record_started UPDATE (blocked on beatA's row lock) then turns the rolled
back *pending* run into running, so no replica re-claims it and nobody plans the next slot.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from tests.chaos_probe.harness import Cluster, setup_django


def main() -> None:
    db, workdir = sys.argv[1], Path(sys.argv[2])
    setup_django(db)
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from scheduling import ledger
    from scheduling.models import Run

    with Cluster(db, workdir) as cl:
        run(cl, workdir)


def run(cl, workdir) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from scheduling import ledger
    from scheduling.models import Run

    cl.start_worker("worker1", concurrency=2)
    cl.start_beat("beatB")
    cl.wait_log("beatB", "beat: Starting...")
    cl.wait_log("worker1", "ready.")
    iv, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    task = PeriodicTask.objects.create(name="victim-1s", task="project.tasks.record", interval=iv)
    time.sleep(5)  # beatB dispatches it; beatB's next reconcile is now ~60 s away
    cl.start_beat("beatA", SCHEDULING_TEST_PAUSE_AFTER_PUBLISH="3")
    t_pause = cl.wait_log("beatA", "test pause: published")
    time.sleep(0.5)
    cl.signal("beatA", signal.SIGKILL)
    t_kill = ledger.database_now()
    print("killed beatA inside its claim at", t_kill)
    # Watch the victim task: when does it get a pending run again, and how late are its runs?
    deadline = time.time() + 75
    while time.time() < deadline:
        time.sleep(0.5)
        if Run.objects.filter(periodic_task=task, status="pending").exists() and \
                Run.objects.filter(periodic_task=task, dispatched_at__gt=t_kill).exists():
            break
    time.sleep(3)
    cl.stop()
    rows = list(Run.objects.filter(periodic_task=task).order_by("scheduled_for").values_list(
        "id", "scheduled_for", "status", "claimed_by", "dispatched_at", "planned_at"))
    out = []
    for r in rows:
        late = (r[4] - r[1]).total_seconds() if r[4] else None
        out.append([r[0], r[1].isoformat(), r[2], r[3], late, r[5].isoformat()])
    for o in out:
        print(o)
    lates = [o[4] for o in out if o[4] is not None]
    print("max lateness after kill:", max(lates))
    print("runs dispatched >1 s late:", sum(1 for x in lates if x > 1))
    print("runs with status not pending but never dispatched:",
          [o for o in out if o[4] is None and o[2] not in ("pending", "cancelled")])
    (workdir / "result.json").write_text(json.dumps(out, default=str, indent=1))


if __name__ == "__main__":
    main()
