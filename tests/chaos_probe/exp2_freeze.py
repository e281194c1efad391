"""Experiment 2: SIGSTOP a replica for 30 s while it holds a claim, then SIGCONT.

    .venv/bin/python -m tests.chaos_probe.exp2_freeze <dbname> <workdir> [worker_during_freeze=1]

beat1..beat3 run normally; "frozen" sleeps 2 s after publishing (test hook) so we know when it is
inside its claim: on its first "test pause: published" line it gets SIGSTOP, 30 s later SIGCONT.
With worker_during_freeze=0 the worker is started only after SIGCONT, so the takeover by the
other replicas is not pre-empted by the worker's record_started (see exp1b).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
import time
from pathlib import Path

from tests.chaos_probe.harness import Cluster, make_tasks, setup_django


def main() -> None:
    db, workdir = sys.argv[1], Path(sys.argv[2])
    worker_during = (sys.argv[3] if len(sys.argv) > 3 else "1") == "1"
    setup_django(db)
    with Cluster(db, workdir) as cl:
        run(cl, db, workdir, worker_during)


def run(cl: Cluster, db: str, workdir: Path, worker_during: bool) -> None:
    import psycopg
    from django.db import connection

    from scheduling import ledger
    from scheduling.models import Run
    from tests.chaos_probe.check import analyse
    from tests.chaos_probe.harness import PG

    for r in ("beat1", "beat2", "beat3"):
        cl.start_beat(r)
    if worker_during:
        cl.start_worker("worker1", concurrency=4)
        cl.wait_log("worker1", "ready.")
    for r in ("beat1", "beat2", "beat3"):
        cl.wait_log(r, "beat: Starting...")
    make_tasks(clocked_in=25.0, prefix="e2")
    time.sleep(8)
    cl.start_beat("frozen", SCHEDULING_TEST_PAUSE_AFTER_PUBLISH="2")
    cl.wait_log("frozen", "test pause: published", timeout=60)
    cl.signal("frozen", signal.SIGSTOP)
    t_stop = ledger.database_now()
    line = [l for l in cl.log_path("frozen").read_text().splitlines() if "test pause" in l][0]
    held = re.search(r"published (\S+),? sleeping", line).group(1).split(",")
    print(f"SIGSTOP at {t_stop}; frozen replica holds {len(held)} runs")

    # Watch pg_stat_activity and the held runs.
    samples = []
    stop_watch = threading.Event()

    def watch() -> None:
        with psycopg.connect(PG + db, autocommit=True) as conn:
            while not stop_watch.is_set():
                rows = conn.execute(
                    "SELECT pid, state, wait_event_type, now()-xact_start, left(query, 60)"
                    " FROM pg_stat_activity WHERE datname=%s AND pid<>pg_backend_pid()"
                    " AND state LIKE 'idle in transaction%%'", [db]).fetchall()
                held_rows = conn.execute(
                    "SELECT status, count(*) FROM scheduling_run WHERE task_id = ANY(%s)"
                    " GROUP BY 1", [held]).fetchall()
                samples.append([round(time.time(), 2), [list(map(str, r)) for r in rows],
                                [list(map(str, r)) for r in held_rows]])
                time.sleep(0.5)

    th = threading.Thread(target=watch)
    th.start()
    time.sleep(30)
    cl.signal("frozen", signal.SIGCONT)
    t_cont = ledger.database_now()
    print(f"SIGCONT at {t_cont}")
    if not worker_during:
        time.sleep(3)
        cl.start_worker("worker1", concurrency=4)
        cl.wait_log("worker1", "ready.")
    time.sleep(20)
    stop_watch.set()
    th.join()
    frozen_after = Run.objects.filter(claimed_by__startswith="frozen", dispatched_at__gt=t_cont).count()
    held_runs = list(Run.objects.filter(task_id__in=held).values_list(
        "periodic_task_name", "scheduled_for", "status", "claimed_by", "dispatched_at", "started_at"))
    frozen_alive = cl.alive("frozen")
    as_of = ledger.database_now()
    for r in ("beat1", "beat2", "beat3", "frozen"):
        cl.stop(r)
    deadline = time.time() + 60
    while time.time() < deadline and Run.objects.filter(
            status__in=("dispatched", "running", "retrying")).exists():
        time.sleep(0.5)
    cl.stop()
    connection.close()
    result = analyse(db, workdir, as_of=as_of)
    takeovers = [(d - t_stop).total_seconds() for *_, d, _ in held_runs if d]
    result["held_runs"] = [[n, str(s), st, c, str(d), str(sa)] for n, s, st, c, d, sa in held_runs]
    result["takeover_seconds_after_SIGSTOP"] = sorted(takeovers)
    result["frozen_dispatches_after_SIGCONT"] = frozen_after
    result["frozen_alive"] = frozen_alive
    # First sample where the idle-in-transaction backend is gone
    gone = [s[0] for s in samples if not s[1]]
    result["idle_in_tx_gone_after_s"] = round(gone[0] - t_stop.timestamp(), 2) if gone else None
    result["samples_head"] = samples[:3] + samples[18:26]
    print(json.dumps(result, indent=1, default=str))
    (workdir / "result.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
