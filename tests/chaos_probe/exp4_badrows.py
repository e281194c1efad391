"""Experiment 4: bad rows. 2 replicas + 1 worker + 20 healthy 1-s interval tasks; inject one bad
input per phase, wait, then record: replicas alive, new error log lines, the bad input's run rows,
and whether the healthy tasks stayed on time in that phase.

    .venv/bin/python -m tests.chaos_probe.exp4_badrows <dbname> <workdir> [phase ...]
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

from tests.chaos_probe.harness import Cluster, setup_django

PHASE_SECONDS = 8.0


def main() -> None:
    db, workdir = sys.argv[1], Path(sys.argv[2])
    only = sys.argv[3:]
    setup_django(db)
    with Cluster(db, workdir) as cl:
        run(cl, db, workdir, only)


def run(cl: Cluster, db: str, workdir: Path, only: list[str]) -> None:
    from django.db import connection
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        PeriodicTasks,
    )

    from scheduling import ledger
    from scheduling.models import Run

    replicas = ["beat1", "beat2"]
    for r in replicas:
        cl.start_beat(r)
    cl.start_worker("worker1", concurrency=4)
    for r in replicas:
        cl.wait_log(r, "beat: Starting...")
    cl.wait_log("worker1", "ready.")
    one, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    healthy = [PeriodicTask.objects.create(name=f"healthy-{i}", task="project.tasks.record",
                                           interval=one) for i in range(20)]
    time.sleep(4)

    def mk(name: str, **kw) -> PeriodicTask:
        kw.setdefault("task", "project.tasks.record")
        if not any(k in kw for k in ("interval", "crontab", "clocked", "solar")):
            kw["interval"] = one
        return PeriodicTask.objects.create(name=name, **kw)

    def p_args():
        return mk("bad-args", args="[1, 2")

    def p_kwargs_list():
        return mk("bad-kwargs-type", kwargs="[1]")

    def p_unknown():
        return mk("bad-unknown-task", task="nope.does_not_exist")

    def p_every0():
        iv = IntervalSchedule.objects.create(every=0, period="seconds")
        return mk("bad-every0", interval=iv)

    def p_cron_never():
        c = CrontabSchedule.objects.create(minute="0", hour="0", day_of_month="30",
                                           month_of_year="2", day_of_week="*", timezone="UTC")
        return mk("bad-cron-never", interval=None, crontab=c)

    def p_cron_invalid():
        c = CrontabSchedule.objects.create(minute="*/0", hour="*", day_of_month="*",
                                           month_of_year="*", day_of_week="*", timezone="UTC")
        return mk("bad-cron-step0", interval=None, crontab=c)

    def p_cron_badtz():
        c = CrontabSchedule.objects.create(minute="*", hour="*", day_of_month="*",
                                           month_of_year="*", day_of_week="*", timezone="UTC")
        t = mk("bad-cron-tz", interval=None, crontab=c)
        with connection.cursor() as cur:
            cur.execute("UPDATE django_celery_beat_crontabschedule SET timezone='Mars/Olympus'"
                        " WHERE id=%s", [c.pk])
        PeriodicTasks.update_changed()
        return t

    def p_clocked_deleted():
        ck = ClockedSchedule.objects.create(
            clocked_time=ledger.database_now() + timedelta(seconds=3))
        t = mk("bad-clocked-deleted", interval=None, clocked=ck, one_off=True)
        time.sleep(1)
        ck.delete()  # cascades to the periodic task (ORM), runs SET NULL
        return t

    def p_interval_deleted():
        iv = IntervalSchedule.objects.create(every=3, period="seconds")
        t = mk("bad-interval-deleted", interval=iv)
        time.sleep(4)
        iv.delete()
        return t

    def p_null_task_run():
        now = ledger.database_now()
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO scheduling_run (periodic_task_id, periodic_task_name, task,"
                " scheduled_for, trigger, status, reason, task_id, slots, claimed_by, error,"
                " worker, requested_by) VALUES (NULL, 'ghost', 'project.tasks.record', %s,"
                " 'schedule', 'pending', '', 'ghost-1', 1, '', '', '', '')", [now])
        return None

    def p_manual_far_past():
        t = mk("odd-manual-far-past", interval=IntervalSchedule.objects.create(
            every=1, period="days"))
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO scheduling_run (periodic_task_id, periodic_task_name, task,"
                " scheduled_for, trigger, status, reason, task_id, slots, claimed_by, error,"
                " worker, requested_by) VALUES (%s, %s, 'project.tasks.record', '1900-01-01',"
                " 'manual', 'pending', '', 'manual-far-past', 1, '', '', '', '')",
                [t.pk, t.name])
        return t

    def p_sched_far_past():
        # A scheduled pending run far in the past, for a 1-second interval task: the one pending
        # run the planner made is replaced by it (one pending run per task).
        t = mk("odd-sched-far-past")
        time.sleep(2)
        with connection.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("DELETE FROM scheduling_run WHERE periodic_task_id=%s AND status="
                        "'pending'", [t.pk])
            cur.execute(
                "INSERT INTO scheduling_run (periodic_task_id, periodic_task_name, task,"
                " scheduled_for, trigger, status, reason, task_id, slots, claimed_by, error,"
                " worker, requested_by) VALUES (%s, %s, 'project.tasks.record', '1900-01-01',"
                " 'schedule', 'pending', '', 'sched-far-past', 1, '', '', '', '')",
                [t.pk, t.name])
            cur.execute("COMMIT")
        return t

    def p_huge_interval():
        iv = IntervalSchedule.objects.create(every=3_000_000, period="days")
        return mk("bad-huge-interval", interval=iv)

    def p_expired():
        return mk("odd-expired", expires=ledger.database_now() - timedelta(hours=1))

    def p_nonexistent_queue():
        return mk("odd-queue-nobody-reads", queue="chaos-nobody-" + db)

    phases = [
        ("invalid_args_json", p_args), ("kwargs_not_object", p_kwargs_list),
        ("unknown_task", p_unknown), ("interval_every_0", p_every0),
        ("crontab_never_matches", p_cron_never), ("crontab_step_0", p_cron_invalid),
        ("crontab_bad_timezone", p_cron_badtz),
        ("clocked_row_deleted", p_clocked_deleted), ("interval_row_deleted", p_interval_deleted),
        ("run_pending_task_null", p_null_task_run), ("manual_run_far_past", p_manual_far_past),
        ("expired_task", p_expired), ("queue_nobody_reads", p_nonexistent_queue),
        ("interval_3e6_days", p_huge_interval), ("scheduled_run_far_past", p_sched_far_past),
    ]
    if only:
        phases = [p for p in phases if p[0] in only]
    results = []
    offsets = {r: cl.log_path(r).stat().st_size for r in replicas}
    for name, inject in phases:
        start = ledger.database_now()
        try:
            task = inject()
            inject_error = None
        except Exception as exc:  # noqa: BLE001
            task, inject_error = None, repr(exc)
        time.sleep(PHASE_SECONDS)
        end = ledger.database_now()
        hs = Run.objects.filter(periodic_task__in=healthy, scheduled_for__gte=start,
                                scheduled_for__lt=end - timedelta(seconds=1))
        late = [(r.dispatched_at - r.scheduled_for).total_seconds() if r.dispatched_at else None
                for r in hs]
        rows = Run.objects.filter(periodic_task_name=task.name if task else "ghost")
        rows = list(rows.order_by("id").values_list(
            "status", "reason", "error", "scheduled_for", "slots")[:4])
        new_log = {}
        for r in replicas:
            text = cl.log_path(r).read_text(errors="replace")[offsets[r]:]
            offsets[r] += len(text.encode())
            new_log[r] = [l[l.find(" scheduling."):][:220] for l in text.splitlines()
                          if ("ERROR" in l or "Traceback" in l or "CRITICAL" in l)
                          and "dispatched" not in l][:4]
        results.append({
            "phase": name,
            "inject_error": inject_error,
            "alive": {r: cl.alive(r) for r in replicas},
            "healthy_slots": len(late),
            "healthy_undispatched": sum(1 for x in late if x is None),
            "healthy_max_lateness": max((x for x in late if x is not None), default=None),
            "task_enabled": (PeriodicTask.objects.filter(pk=task.pk).values_list(
                "enabled", flat=True).first() if task else None),
            "bad_rows": [[s, rsn, (e or "")[:160], str(sf), sl] for s, rsn, e, sf, sl in rows],
            "errors_logged": new_log,
        })
        print(json.dumps(results[-1], default=str), flush=True)
    (workdir / "result.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
