"""The benchmark's peers, each alone and undisturbed, send every run once (issue 17, acceptance 2).

So that the correctness rows of ``python -m bench`` count faults, not a baseline run wrongly:
one stock ``DatabaseScheduler`` beat, one RedBeat beat (its defaults) and one beat of the seed's
Redlock baseline (``bench.redlock_beat``), each with its own worker and execution log, run 5
interval tasks every second; over a 15 s window after the first sends, each task's executions
(``bench.counts.by_time``, from the worker's log) show no duplicate and no lost run, and number
the window's slots, less up to a fifth where the sender ran late: celery's interval schedule
sends next at the last send plus the interval, so each send's lateness adds up (on a busy
machine RedBeat sent 13 runs in 15 s, each about 1.1 s after the previous one); or one more,
the run due just before the window, late into it.

django-periodic-tasks (``bench.dpt_peer``) runs as in the correctness scenario: 3 schedulers and
django-tasks-db's worker, on its cron schedule, every 4 s (its scheduler ticks once a second, and
sends a slot missed by more than a tick not at all: a 1 s interval would lose runs to the ticks'
own length); its runs counted at the time each was enqueued, and each went through its
``@exactly_once`` permit once (its TaskExecution row COMPLETED after one dispatch).
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections import defaultdict

import pytest
from django.conf import settings

from bench import counts, dpt_peer
from bench.correctness import forget_redis_keys
from bench.peers import (
    LEAD,
    REDBEAT,
    REDLOCK,
    STOCK,
    Faults,
    Peer,
    database_tasks,
    redbeat_entries,
    redis_url_for,
    tell_stock_beats,
    wait_for_worker,
)
from tests.acceptance.deployment import Deployment

pytestmark = [
    pytest.mark.acceptance, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600),
]

BASELINE = Faults(tasks=5, every=1, warm_slots=0, pause=0, after_slots=0, observe=0,
                  redbeat_tuned=0)
WINDOW = 15  # seconds counted


def _redis() -> str:
    url = redis_url_for(settings.CELERY_BROKER_URL)
    if url is None:
        pytest.skip("RedBeat and the Redlock baseline need Redis (a redis:// broker or"
                    " BENCH_REDIS_URL)")
    return url


def _peer(kind: str, deployment: Deployment) -> Peer:
    prefix = f"baseline-{kind}-{uuid.uuid4().hex[:8]}"
    if kind == "stock":
        return Peer(kind, kind, prefix, deployment, ["beat"], STOCK)
    if kind == "redlock":
        env = {"BENCH_REDLOCK_URL": _redis(), "BENCH_REDLOCK_TTL": "0.5",
               "BENCH_REDLOCK_PREFIX": prefix}
        return Peer(kind, kind, prefix, deployment, ["beat"], REDLOCK, env)
    env = {"DJANGO_SETTINGS_MODULE": "bench.peer_settings", "BENCH_REDBEAT_URL": _redis(),
           "BENCH_REDBEAT_PREFIX": prefix}
    return Peer(kind, "redbeat", prefix, deployment, ["beat"], REDBEAT, env)


@pytest.mark.parametrize("kind", ["stock", "redbeat", "redlock"])
def test_a_baseline_alone_sends_every_run_once(kind: str, deployment: Deployment):
    peer = _peer(kind, deployment)
    try:
        _run_alone(peer, deployment)
    finally:
        if peer.kind != "stock":  # RedBeat's schedule and lock, the Redlock baseline's locks
            forget_redis_keys(_redis(), peer.prefix)


def _run_alone(peer: Peer, deployment: Deployment) -> None:
    if peer.kind == "redbeat":
        redbeat_entries(peer, BASELINE, peer.env["BENCH_REDBEAT_URL"])
    deployment.start_worker("worker", concurrency=2)
    peer.start()
    deployment.wait_ready(timeout=180)
    if peer.kind == "redbeat":
        deployment.wait_for_log("beat", "Acquired lock", timeout=60)
    anchor = time.time() + LEAD
    if peer.kind != "redbeat":
        database_tasks(peer.prefix, BASELINE, anchor, stock=True)
        tell_stock_beats(until=anchor - 1)
    start = anchor + 2.5  # half an interval off the sends, after the first two
    end = start + WINDOW
    time.sleep(max(0.0, end + BASELINE.every - time.time()))  # the window's last run is late
    deployment.stop("beat")
    horizon = time.time()
    wait_for_worker(deployment)
    _assert_every_slot_once(peer, deployment, BASELINE.every, WINDOW, start, horizon)
    if peer.kind == "redlock":  # it went through the lock: one decision per send, all sent
        log = deployment.log_path("beat").read_text(errors="replace")
        assert log.count("redlock: sent ") >= BASELINE.tasks * WINDOW - BASELINE.tasks
        assert "redlock: skipped" not in log


def test_django_periodic_tasks_alone_sends_every_run_once(deployment: Deployment):
    every, window = 4, 32
    url = deployment.env["DATABASE_URL"]
    dpt_peer.migrate(url)
    peer = Peer("dpt", "dpt", f"baseline-dpt-{uuid.uuid4().hex[:8]}", deployment,
                ["scheduler-1", "scheduler-2", "scheduler-3"])
    try:
        peer.start_worker()
        peer.start()
        deployment.wait_ready(timeout=180)
        anchor = math.ceil((time.time() + LEAD) / every) * every  # a slot of its cron schedule
        dpt_peer.create_tasks(url, peer.prefix, BASELINE.tasks, every, anchor)
        start = anchor + 2.5 * every  # half an interval off the sends, after the first two
        time.sleep(max(0.0, start + window + every - time.time()))
        deployment.stop(*peer.beats)
        horizon = time.time()
        wait_for_worker(deployment, dpt_peer.waiting)
    finally:
        dpt_peer.disable_tasks(url, peer.prefix)
    _assert_every_slot_once(peer, deployment, every, window, start, horizon)
    from django.db import connection

    with connection.cursor() as cursor:  # each run went through its permit, dispatched once
        cursor.execute(
            "SELECT e.status, e.dispatch_count, count(*) FROM django_periodic_tasks_taskexecution e"
            " JOIN django_periodic_tasks_scheduledtask t ON t.id = e.scheduled_task_id"
            " WHERE t.name LIKE %s GROUP BY 1, 2", [f"{peer.prefix}-%"])
        permits = cursor.fetchall()
    executed = len(deployment.executions())
    assert permits == [("completed", 1, executed)], (permits, executed)


def _assert_every_slot_once(peer: Peer, deployment: Deployment, every: int, window: int,
                            start: float, horizon: float) -> None:
    at = "enqueued_at" if peer.kind == "dpt" else "at"
    times: dict[str, list[float]] = defaultdict(list)
    for record in deployment.executions():
        times[str(record["label"])].append(float(record[at]))
    slots = window // every
    end = start + window
    for i in range(BASELINE.tasks):
        label = f"{peer.prefix}-{i}"
        found = counts.by_time(times[label], every, start, end, horizon)
        # A copy executes beside its original: no two executions within half an interval.
        ordered = sorted(times[label])
        closest = min(later - earlier for earlier, later in itertools.pairwise(ordered))
        assert closest >= every / 2, (label, closest, found)
        assert found.slots == slots, (label, found)
        # By time, one send late by about half an interval reads as a lost slot and the next
        # slot's run (bench/counts.py): seen once for stock beat at load 19. A baseline that
        # really skips runs loses one in every window, or more.
        assert found.lost <= 1, (label, found)
        # Late sends add up (next send = last send + interval): fewer runs, none lost. One more
        # than the window's slots is the run due half an interval before the window's start,
        # sent or executed that much late on a busy machine (seen once for stock beat in CI).
        assert slots - slots // 5 <= found.executions <= slots + 1, (label, found)

