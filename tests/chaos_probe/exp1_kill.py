"""Experiment 1: 4 replicas, SIGKILL + restart random replicas every few seconds for 2 minutes.

    .venv/bin/python -m tests.chaos_probe.exp1_kill <dbname> <workdir> [pause_seconds] [duration]

With pause_seconds > 0, replicas sleep that long between publishing and committing (the test hook),
so most kills land inside a claim transaction (after publish, before commit).
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from pathlib import Path

from tests.chaos_probe.harness import Cluster, make_tasks, setup_django


def main() -> None:
    db, workdir = sys.argv[1], Path(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    duration = float(sys.argv[4]) if len(sys.argv) > 4 else 120.0
    setup_django(db)
    from django.db import connection

    from scheduling import ledger
    from scheduling.models import Run
    from tests.chaos_probe.check import analyse

    env = {"SCHEDULING_TEST_PAUSE_AFTER_PUBLISH": str(pause)} if pause else {}
    with Cluster(db, workdir, **env) as cl:
        run(cl, db, workdir, duration)


def run(cl, db, workdir, duration) -> None:
    from django.db import connection

    from scheduling import ledger
    from scheduling.models import Run
    from tests.chaos_probe.check import analyse

    replicas = [f"beat{i}" for i in range(1, 5)]
    for r in replicas:
        cl.start_beat(r)
    cl.start_worker("worker1", concurrency=6)
    for r in replicas:
        cl.wait_log(r, "beat: Starting...")
    cl.wait_log("worker1", "ready.")
    make_tasks(clocked_in=40.0, prefix="e1")
    t0 = time.time()
    kills = []
    rnd = random.Random(1)
    while time.time() - t0 < duration:
        time.sleep(rnd.uniform(1.0, 4.0))
        victims = rnd.sample(replicas, rnd.choice([1, 1, 1, 2, 3]))
        for v in victims:
            cl.signal(v, signal.SIGKILL)
        kills.append([round(time.time() - t0, 2), victims])
        time.sleep(rnd.uniform(0.0, 1.5))
        for v in victims:
            cl.start_beat(v)
    t1 = time.time()
    time.sleep(8)
    as_of = ledger.database_now()
    cl.stop(*replicas)
    # drain
    deadline = time.time() + 60
    while time.time() < deadline and Run.objects.filter(
        status__in=("dispatched", "running", "retrying")
    ).exists():
        time.sleep(0.5)
    cl.stop("worker1")
    connection.close()
    result = analyse(db, workdir, (t0, t1), as_of=as_of)
    result["kills"] = len(kills)
    result["kill_events"] = sum(len(v) for _, v in kills)
    print(json.dumps(result, indent=1, default=str))
    (workdir / "result.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
