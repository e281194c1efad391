"""Experiment 3: terminate every connection to the database repeatedly.

    .venv/bin/python -m tests.chaos_probe.exp3_terminate <dbname> <workdir> [duration] [period]

4 replicas + 1 worker, ~50 tasks. Every `period` s (jittered) runs
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname=<db> AND pid<>pg_backend_pid()
Afterwards: are the replicas alive, do they resume, how many log lines per outage, lateness,
gaps, runs stuck in dispatched/running (worker outcome writes lost), duplicates.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from tests.chaos_probe.harness import Cluster, make_tasks, setup_django


def main() -> None:
    db, workdir = sys.argv[1], Path(sys.argv[2])
    duration = float(sys.argv[3]) if len(sys.argv) > 3 else 90.0
    period = float(sys.argv[4]) if len(sys.argv) > 4 else 3.0
    setup_django(db)
    with Cluster(db, workdir) as cl:
        run(cl, db, workdir, duration, period)


def run(cl: Cluster, db: str, workdir: Path, duration: float, period: float) -> None:
    import psycopg
    from django.db import connection

    from scheduling.models import Run
    from tests.chaos_probe.check import analyse
    from tests.chaos_probe.harness import PG

    replicas = [f"beat{i}" for i in range(1, 5)]
    for r in replicas:
        cl.start_beat(r)
    cl.start_worker("worker1", concurrency=4)
    for r in replicas:
        cl.wait_log(r, "beat: Starting...")
    cl.wait_log("worker1", "ready.")
    make_tasks(clocked_in=30.0, prefix="e3")
    time.sleep(5)
    rnd = random.Random(3)
    t0 = time.time()
    terminations = []
    with psycopg.connect(PG + db, autocommit=True) as conn:
        while time.time() - t0 < duration:
            time.sleep(rnd.uniform(0.5 * period, 1.5 * period))
            n = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname=%s AND pid<>pg_backend_pid()", [db]).fetchone()[0]
            terminations.append([round(time.time() - t0, 2), n])
    t1 = time.time()
    connection.close()  # ours was terminated too
    time.sleep(10)
    alive = {r: cl.alive(r) for r in replicas}
    # did every replica dispatch something in the last 10 s?
    from django.utils import timezone
    from datetime import timedelta
    recent = set(Run.objects.filter(dispatched_at__gt=timezone.now() - timedelta(seconds=9))
                 .values_list("claimed_by", flat=True))
    from scheduling import ledger

    as_of = ledger.database_now()
    for r in replicas:
        cl.stop(r)
    deadline = time.time() + 30
    while time.time() < deadline and Run.objects.filter(
            status__in=("dispatched", "running", "retrying")).exists():
        time.sleep(0.5)
    cl.stop()
    connection.close()
    result = analyse(db, workdir, (t0, t1), as_of=as_of)
    logs = {}
    for r in replicas:
        text = cl.log_path(r).read_text(errors="replace")
        logs[r] = {
            "db_down_lines": text.count("database unavailable"),
            "recovered_lines": text.count("reachable again"),
            "tick_failed": text.count("scheduler tick failed"),
            "tracebacks": text.count("Traceback"),
        }
    wtext = cl.log_path("worker1").read_text(errors="replace")
    result["worker_log"] = {
        "signal_handler_errors": wtext.count("Signal handler"),
        "tracebacks": wtext.count("Traceback"),
        "OperationalError": wtext.count("OperationalError"),
    }
    result["terminations"] = len(terminations)
    result["backends_terminated"] = sum(n for _, n in terminations)
    result["replica_logs"] = logs
    result["alive_after"] = alive
    result["dispatching_in_last_9s"] = sorted(recent)
    print(json.dumps(result, indent=1, default=str))
    (workdir / "result.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
