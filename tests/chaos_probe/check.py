"""Ledger + execution-log checks shared by the experiments.

    .venv/bin/python -m tests.chaos_probe.check <dbname> <workdir> [window_start_epoch window_end_epoch]
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path


def analyse(db: str, workdir: Path, window: tuple[float, float] | None = None,
            as_of: datetime | None = None) -> dict:
    """``as_of``: when the replicas were stopped (stuck pending runs are counted before it)."""
    from django.db import connection
    from django_celery_beat.models import PeriodicTask

    from scheduling.models import Run

    out: dict = {}
    if as_of is None:
        from scheduling.ledger import database_now

        as_of = database_now()
    with connection.cursor() as c:
        c.execute("SELECT status, trigger, count(*) FROM scheduling_run GROUP BY 1,2 ORDER BY 1,2")
        out["status_counts"] = [list(r) for r in c.fetchall()]
        c.execute(
            "SELECT periodic_task_id, scheduled_for, count(*) FROM scheduling_run"
            " WHERE trigger='schedule' AND status<>'cancelled' GROUP BY 1,2 HAVING count(*)>1"
        )
        out["duplicate_ledger_rows"] = [list(map(str, r)) for r in c.fetchall()]
        c.execute(
            "SELECT task_id, count(*) FROM scheduling_run WHERE status<>'cancelled'"
            " GROUP BY 1 HAVING count(*)>1"
        )
        out["duplicate_task_ids"] = [list(map(str, r)) for r in c.fetchall()]
        c.execute(
            "SELECT id, periodic_task_name, scheduled_for, %s-scheduled_for"
            " FROM scheduling_run WHERE status='pending'"
            " AND scheduled_for < %s - interval '5 seconds'", [as_of, as_of]
        )
        out["stuck_pending"] = [list(map(str, r)) for r in c.fetchall()]
        c.execute(
            "SELECT count(*), max(extract(epoch from dispatched_at-scheduled_for)),"
            " percentile_cont(0.99) within group (order by extract(epoch from dispatched_at-scheduled_for)),"
            " percentile_cont(0.5) within group (order by extract(epoch from dispatched_at-scheduled_for)),"
            " count(*) filter (where dispatched_at-scheduled_for > interval '1 second'),"
            " count(*) filter (where dispatched_at-scheduled_for > interval '2 second'),"
            " count(*) filter (where dispatched_at-scheduled_for > interval '5 second'),"
            " count(*) filter (where dispatched_at-scheduled_for > interval '12 second')"
            " FROM scheduling_run WHERE dispatched_at IS NOT NULL"
        )
        n, mx, p99, p50, gt1, gt2, gt5, gt12 = c.fetchone()
        out["lateness"] = {"dispatched": n, "max_s": mx and float(mx), "p99_s": p99, "p50_s": p50,
                           ">1s": gt1, ">2s": gt2, ">5s": gt5, ">12s": gt12}
        c.execute("SELECT count(*) FROM scheduling_run WHERE slots > 1")
        out["coalesced_runs"] = c.fetchone()[0]
        c.execute("SELECT status, count(*) FROM scheduling_run WHERE status IN"
                  " ('dispatched','running','retrying') GROUP BY 1")
        out["unfinished"] = [list(r) for r in c.fetchall()]

    # Gaps in every interval task's chain of slots (non-cancelled scheduled runs).
    gaps = []
    lo = datetime.fromtimestamp(window[0], UTC) if window else None
    hi = datetime.fromtimestamp(window[1], UTC) if window else None
    for task in PeriodicTask.objects.filter(interval__isnull=False).select_related("interval"):
        step = timedelta(**{task.interval.period: task.interval.every})
        runs = list(
            Run.objects.filter(periodic_task=task, trigger="schedule")
            .exclude(status__in=("cancelled",))
            .exclude(reason="invalid schedule")
            .order_by("scheduled_for")
            .values_list("scheduled_for", "slots", "status")
        )
        for (a, slots_a, _), (b, _, _) in zip(runs, runs[1:]):
            if lo and (b < lo or a > hi):
                continue
            if b - a != step * slots_a:
                gaps.append([task.name, str(a), str(b), (b - a).total_seconds()])
    out["interval_gaps"] = gaps

    # Execution log vs ledger.
    log = workdir / "executions.jsonl"
    execs = [json.loads(l) for l in log.read_text().splitlines() if l.strip()] if log.exists() else []
    by_id = Counter(e["task_id"] for e in execs)
    dup_ids = {tid: n for tid, n in by_id.items() if n > 1}
    by_slot: dict[tuple, set] = defaultdict(set)
    slot_count: Counter = Counter()
    for e in execs:
        if e.get("scheduled_for"):
            by_slot[(e["periodic_task_name"], e["scheduled_for"])].add(e["task_id"])
            slot_count[(e["periodic_task_name"], e["scheduled_for"])] += 1
    out["executions"] = len(execs)
    out["executions_same_task_id_dup"] = dup_ids
    out["slots_executed_twice"] = sum(1 for n in slot_count.values() if n > 1)
    out["slots_with_different_task_ids"] = [
        [k[0], k[1], sorted(v)] for k, v in by_slot.items() if len(v) > 1
    ]
    dispatched_ids = set(
        Run.objects.exclude(dispatched_at__isnull=True).values_list("task_id", flat=True)
    )
    out["executed_not_in_ledger_as_dispatched"] = sorted(set(by_id) - dispatched_ids)[:20]
    finished = set(
        Run.objects.filter(status__in=("succeeded", "failed", "running", "dispatched"))
        .exclude(dispatched_at__isnull=True).values_list("task_id", flat=True)
    )
    out["dispatched_never_executed"] = len(finished - set(by_id))
    return out


def main() -> None:
    from tests.chaos_probe.harness import setup_django

    db, workdir = sys.argv[1], Path(sys.argv[2])
    setup_django(db)
    window = (float(sys.argv[3]), float(sys.argv[4])) if len(sys.argv) > 4 else None
    print(json.dumps(analyse(db, workdir, window), indent=1, default=str))


if __name__ == "__main__":
    main()
