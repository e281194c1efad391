"""Correctness beside speed: duplicate executions and lost runs of each peer under two faults.

Peers, each a deployment of its own (queue, worker, execution log) on the same PostgreSQL and
broker, running interval tasks that call ``project.tasks.record``:

- ours: 3 replicas of ``LedgerScheduler``;
- stock: 3 stock django-celery-beat ``DatabaseScheduler`` beats (one per container, as stock is
  deployed when beat runs in every container);
- RedBeat, as its documentation says: one active beat holding its Redis lock and a standby
  waiting for it, with the default lock timeout (1,500 s) and with a tuned one;
- Redlock per container: the seed's system (``bench.redlock_beat``, a baseline): 3 stock beats,
  each run sent only by the beat that takes its Redis lock (TTL half the interval);
- django-periodic-tasks (``bench.dpt_peer``): 3 ``run_scheduler`` processes (SKIP LOCKED claim
  per tick) and django-tasks-db's ``db_worker``, its task behind ``@exactly_once``, in a
  virtualenv of its own (Python 3.13, Django 6.0). Its schedule is cron, so the slots are the
  multiples of the interval: the anchor below is one. Its runs are placed at the time they were
  enqueued (the worker logs it beside the execution's): its worker polls once a second.

Two faults, one after the other, each counted over its own window: SIGSTOP of the busiest
scheduler for longer than a TTL, then SIGCONT; then SIGKILL of the busiest scheduler. From the
SIGCONT to the end of its window a scheduler that exits (RedBeat's beat that finds its lock
expired) is started again at once, as a container's restart policy would. Executions come from
each worker's own log (``bench.counts`` says how they are matched to runs); the ledger is read
only to find our busiest replica and to explain a count that is not zero. How each peer is
deployed: ``bench.peers``.

ours, stock and Redlock read the same periodic task table, so ours runs beside the two RedBeat
deployments (their schedule lives in Redis), then stock beside Redlock and django-periodic-tasks
(its own tables), on tasks of their own;
the periodic tasks of the earlier scenarios are disabled first (this scenario runs last).
"""

from __future__ import annotations

import logging
import math
import signal
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime

from django.db.models import Count
from django_celery_beat.models import PeriodicTask, PeriodicTasks

from bench import counts, dpt_peer
from bench.counts import Counts
from bench.peers import (
    FULL,
    LEAD,
    PEERS,
    QUICK,
    Faults,
    Peer,
    database_tasks,
    make_peer,
    redbeat_entries,
    redis_url_for,
    tell_stock_beats,
    wait_for_worker,
)
from bench.report import Row
from scheduling import slots
from scheduling.models import Run

logger = logging.getLogger(__name__)


def correctness(bench) -> list[Row]:
    """Both faults for every peer; the duplicates and lost rows of each fault."""
    from bench import scenarios

    f = QUICK if bench.sizes is scenarios.QUICK else FULL
    redis_url = redis_url_for(bench.broker.url)
    PeriodicTask.objects.filter(enabled=True).update(enabled=False)
    PeriodicTasks.update_changed()
    results: dict[str, dict[str, Counts]] = {}
    run_id = uuid.uuid4().hex[:8]
    slices = [["ours", "redbeat", "redbeat_tuned"], ["stock", "redlock", "dpt"]]
    for keys in slices:
        if redis_url is None:
            keys = [k for k in keys if k in ("ours", "stock", "dpt")]
        peers = [make_peer(bench, key, f, redis_url, run_id) for key in keys]
        try:
            results.update(_run_slice(bench, peers, f, redis_url, run_id))
        finally:
            for peer in peers:
                peer.deployment.stop()
                bench.broker.delete(peer.deployment.queue)
                if peer.kind == "dpt":
                    dpt_peer.disable_tasks(peer.deployment.env["DATABASE_URL"], peer.prefix)
            if redis_url is not None:  # RedBeat's schedules and locks, the Redlock keys
                forget_redis_keys(redis_url, f"bench-{run_id}-")
            PeriodicTask.objects.filter(enabled=True).update(enabled=False)
            PeriodicTasks.update_changed()
    return _rows(f, results, redis_url is not None)


def _run_slice(bench, peers: list[Peer], f: Faults, redis_url: str | None,
               run_id: str) -> dict[str, dict[str, Counts]]:
    every = f.every
    for peer in peers:
        if peer.kind == "redbeat":
            redbeat_entries(peer, f, redis_url)
        peer.start_worker()
    for peer in peers:
        peer.start()
    for peer in peers:
        if peer.kind == "redbeat":
            peer.deployment.wait_for_log(peer.beats[0], "Acquired lock", timeout=180)
            peer.start(standbys=True)
    for peer in peers:
        peer.deployment.wait_ready(timeout=180)
    # Tasks created now, first slot LEAD s ahead: stock beat sees new tasks within its 5 s tick.
    anchor = math.ceil((time.time() + LEAD) / every) * every  # a slot of cron's (see above)
    for prefix in dict.fromkeys(p.prefix for p in peers if p.kind not in ("redbeat", "dpt")):
        database_tasks(prefix, f, anchor, stock=not prefix.startswith("fault-ours"))
    for peer in peers:
        if peer.kind == "dpt":
            dpt_peer.create_tasks(peer.deployment.env["DATABASE_URL"], peer.prefix, f.tasks, every,
                                  anchor)
    tell_stock_beats(until=anchor - 1)
    _sleep_until(anchor + f.warm_slots * every)
    _wait_for_first_runs(peers, f)  # a loaded machine may start a peer's sending late
    n = math.ceil((time.time() - anchor) / every)
    stopped_at = anchor + (n + 1.15) * every
    windows = {"stop": (anchor + (n + 0.5) * every, 0.0)}
    _sleep_until(windows["stop"][0])
    for peer in peers:
        peer.mark()
    _sleep_until(stopped_at)
    frozen = {p.column: p.busiest(windows["stop"][0]) for p in peers}
    for peer in peers:
        peer.deployment.send(frozen[peer.column], signal.SIGSTOP)
    bench.log(f"  correctness: SIGSTOP {frozen}")
    _sleep_until(stopped_at + f.pause)
    for peer in peers:
        peer.deployment.send(frozen[peer.column], signal.SIGCONT)
    end = stopped_at + f.pause + (f.after_slots + 0.35) * every
    windows["stop"] = (windows["stop"][0], end)
    # A container's restart policy: a beat that exits (RedBeat's, finding its lock expired on
    # its first tick after the SIGCONT) is started again at once, until the window ends.
    restarted: dict[str, dict[str, int]] = {p.column: {} for p in peers}
    while time.time() < end:
        for peer in peers:
            restarted[peer.column].update(peer.restart_exited())
        time.sleep(0.2)
    bench.log(f"  correctness: restarted (log offsets) {restarted}")
    for peer in peers:
        for name, size in restarted[peer.column].items():
            peer.deployment.wait_for_log(name, "beat: Starting...", timeout=180, after=size)
    n = math.ceil((time.time() - anchor) / every)
    start = anchor + (n + 0.5) * every
    _sleep_until(start)
    for peer in peers:
        peer.mark()
    killed_at = start + 0.65 * every
    _sleep_until(killed_at)
    victims = {p.column: p.busiest(start) for p in peers}
    for peer in peers:
        peer.deployment.kill(victims[peer.column])
    bench.log(f"  correctness: SIGKILL {victims}")
    windows["kill"] = (start, killed_at + f.observe + 0.35 * every)
    # One interval more, so that a late run of the window's last slot is seen as that run.
    _sleep_until(windows["kill"][1] + every)
    for peer in peers:
        peer.deployment.stop(*[n for n in peer.beats if peer.deployment.alive(n)])
    horizon = time.time()
    for peer in peers:
        queue = peer.deployment.queue
        if peer.kind == "dpt":
            wait_for_worker(peer.deployment, dpt_peer.waiting)
        else:
            wait_for_worker(peer.deployment, lambda q=queue: bench.broker.count(q))
        if peer.kind == "ours":  # and every run it dispatched has finished (bounded)
            wait_for_worker(peer.deployment, lambda p=peer.prefix: _unfinished(p))
    bench.log(f"  correctness windows (epoch s): {windows}")
    return {p.column: _count(p, f, windows, horizon) for p in peers}


def _wait_for_first_runs(peers: list[Peer], f: Faults, timeout: float = 180.0) -> None:
    """Wait until every peer's worker has executed a run of each of its tasks, and each of the
    stock-based peers' beats has sent something (a warning when one has not: its row then counts
    fewer beats than the peer's)."""
    deadline = time.monotonic() + timeout
    for peer in peers:
        wanted = {f"{peer.prefix}-{i}" for i in range(f.tasks)}
        while time.monotonic() < deadline:
            if wanted <= {str(r["label"]) for r in peer.deployment.executions()}:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"correctness: {peer.column} executed none of some tasks within"
                               f" {timeout:.0f} s")
    for peer in peers:  # every stock beat is sending (one once sent nothing: it is logged)
        if peer.kind not in ("stock", "redlock"):
            continue
        for name in peer.beats:
            path = peer.deployment.log_path(name)
            while time.monotonic() < deadline:
                if b"Sending due task" in path.read_bytes():
                    break
                time.sleep(0.2)
            else:
                logger.warning("correctness: %s's %s has sent nothing; counted as it is",
                               peer.column, name, extra={"action": "bench"})


def forget_redis_keys(url: str, prefix: str) -> None:
    """Delete the keys the peers left in Redis: names starting with ``prefix`` (RedBeat's) or
    with pottery's ``redlock:`` followed by it (the Redlock baseline's)."""
    import redis

    client = redis.Redis.from_url(url)
    for pattern in (f"{prefix}*", f"redlock:{prefix}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)


def _unfinished(prefix: str) -> int:
    return Run.objects.filter(
        periodic_task_name__startswith=prefix,
        status__in=(Run.Status.DISPATCHED, Run.Status.RUNNING, Run.Status.RETRYING),
    ).count()


def _count(
    peer: Peer, f: Faults, windows: dict[str, tuple[float, float]], horizon: float
) -> dict[str, Counts]:
    by_label: dict[str, list[dict]] = defaultdict(list)
    for record in peer.deployment.executions():
        by_label[str(record["label"])].append(record)
    labels = [f"{peer.prefix}-{i}" for i in range(f.tasks)]
    result = {}
    for fault, (start, end) in windows.items():
        total = counts.NONE
        if peer.kind == "ours":
            tasks = {t.name: t for t in PeriodicTask.objects.filter(name__in=labels)}
            since, until = (datetime.fromtimestamp(x, UTC) for x in (start, end))
            for label in labels:
                executed = [datetime.fromisoformat(str(r["scheduled_for"]))
                            for r in by_label[label]]
                expected = list(slots.slots_between(tasks[label], since, until))
                total += counts.by_slot(executed, expected)
        else:
            at = "enqueued_at" if peer.kind == "dpt" else "at"
            for label in labels:
                times = [float(r[at]) for r in by_label[label]]
                total += counts.by_time(times, f.every, start, end, horizon)
        result[fault] = total
        if peer.kind == "ours" and (total.duplicates or total.lost):
            since, until = (datetime.fromtimestamp(x, UTC) for x in (start, end))
            runs = Run.objects.filter(periodic_task_name__startswith=peer.prefix,
                                      scheduled_for__gte=since, scheduled_for__lt=until)
            statuses = dict(runs.values_list("status").annotate(n=Count("id"))
                            .values_list("status", "n"))
            logger.warning("correctness, ours, %s: %s; the ledger's runs: %s", fault, total,
                           statuses, extra={"action": "bench"})
    return result


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


def _rows(f: Faults, results: dict[str, dict[str, Counts]], redis: bool) -> list[Row]:
    quick = " (quick: shorter faults)" if f is QUICK else ""
    labels = {
        "stop": f"correctness: SIGSTOP {f.pause} s of the busiest scheduler, then SIGCONT{quick}",
        "kill": f"correctness: SIGKILL of the busiest scheduler, {f.observe} s after{quick}",
    }
    rows = []
    for fault, label in labels.items():
        ours = results["ours"][fault]
        scenario = f"{label}; {f.tasks} tasks every {f.every} s, {ours.slots:,} runs due"
        for measure, attr in (("duplicate executions", "duplicates"), ("lost runs", "lost")):
            cells = {}
            for key in PEERS:
                if key in results:
                    cells[key] = f"{getattr(results[key][fault], attr):,}"
                else:
                    cells[key] = "n/a (no Redis)"
            value = getattr(ours, attr)
            rows.append(Row(
                scenario, f"{measure} (worker's log)", cells["ours"], stock=cells["stock"],
                redbeat=cells["redbeat"], redbeat_tuned=cells["redbeat_tuned"],
                redlock=cells["redlock"], dpt=cells["dpt"], target="0", met=value == 0,
            ))
    return rows
