"""Issue 18, acceptance 3: a replica, then a worker, cut off silently for 60 s mid-claim.

The replica runs in a network namespace of its own behind a router (``tests.netns``); this
test's PostgreSQL and Redis listen on the root namespace's end of the veth pair, so the replica
reaches both across it and the router can drop its packets, not refuse them: the server and the
replica see nothing at all, as across a broken switch. The cut comes while the replica holds a
claim (a pausing replica, ``tests.acceptance.pausing``: published, not committed) and lasts 60 s.

What the partition is bounded by (docs/outages.md, "Network partitions"): the server gives up on
the silent session after the keepalive bound, ``ledger.session.Keepalives.bound`` (5 + 3 x 2 =
11 s: probes when its last reply was acknowledged, ``tcp_user_timeout`` when it was not), which
ends the transaction and frees the row locks; the idle-in-transaction timeout is set above it
here (30 s), so the partition's own bound is what is measured. Another replica then dispatches
the runs at its next tick. The cut-off replica's COMMIT goes unacknowledged; the client's
``tcp_user_timeout`` (the example settings, the same 11 s) fails it within the partition, and
the replica says so once, after its reconnect has given up too (``connect_timeout``, 10 s). When the network returns, the replica commits nothing (its claim
ended with its session), and the copies it published are dropped by the worker guard.

The second test cuts a worker off mid-run, from the database and the broker both (its host's
network gone): its execution lock is freed within the same bound, the broker's redelivery of its
message is suppressed elsewhere, and its outcome, retried, is recorded when the network returns.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime

import pytest

from scheduling.ledger.session import keepalives
from tests import netns
from tests.acceptance import private_redis
from tests.acceptance.deployment import ROOT, Deployment, wait_until
from tests.acceptance.private_postgres import PrivatePostgres

# Its own PostgreSQL and Redis, whatever the suite's are: `.ci/run`'s first pass runs it.
# Each test waits out a 60 s partition and the bounds after it: 2 to 3 minutes, more than the
# suite's 300 s timeout at load 20.
pytestmark = [pytest.mark.acceptance, pytest.mark.once, pytest.mark.timeout(900)]

CUT_FOR = 60.0
IDLE_TIMEOUT = 30.0  # above the keepalive bound: the partition's bound is what ends the claim
PAUSE = 5.0  # the cut-off replica's pause inside its claim, then its COMMIT
SLACK = 4.0  # a rescuer's next tick and claim, on a loaded machine
CONNECT_TIMEOUT = 10.0  # the example settings' libpq connect_timeout

#: The pausing replica's line: its time stamp (local time) and the task ids it published.
PUBLISHED = re.compile(
    r"^(\S+ \S+) WARNING \S+ test pause: published ([^,\s]+(?:,[^,\s]+)*),", re.MULTILINE
)

CREATE_TASKS = """
from datetime import timedelta
from django_celery_beat.models import ClockedSchedule, PeriodicTask
from scheduling import ledger
slot = ClockedSchedule.objects.create(clocked_time=ledger.database_now() + timedelta(seconds=2))
for i in range(3):
    PeriodicTask.objects.create(
        name=f"cut-{i}", task="project.tasks.record", clocked=slot, one_off=True,
        kwargs='{"label": "c%d"}' % i,
    )
"""


def _require(reason: str | None) -> None:
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def network():
    """A node namespace behind a router (``tests.netns``), deleted at the end whatever happens."""
    _require(netns.unavailable())
    network = netns.Network()
    try:
        yield network
    finally:
        network.close()


@pytest.fixture
def pg(network):
    """This test's PostgreSQL, listening on the root end of the network, migrated."""
    server = PrivatePostgres(listen=(network.database, private_redis.free_port(network.database)))
    try:
        server.manage("migrate", "--verbosity", "0")
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(network, tmp_path):
    """A Redis of this test's own on the root end of the network (no persistence)."""
    _require(None if shutil.which("redis-server") else private_redis.MISSING)
    with private_redis.private_redis(tmp_path, network.broker) as url:
        yield url


def _now(pg: PrivatePostgres) -> datetime:
    return pg.query("SELECT clock_timestamp()")[0][0]


def _sessions(pg: PrivatePostgres, replica: str) -> list[tuple]:
    return pg.query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
        [f"scheduling-beat:{replica}"],
    )


def _runs(pg: PrivatePostgres) -> list[tuple]:
    return pg.query(
        "SELECT periodic_task_name, task_id, status, claimed_by, dispatched_at, executions,"
        " suppressed FROM scheduling_run ORDER BY periodic_task_name"
    )


def test_a_replica_cut_off_mid_claim_for_60_s(tmp_path, network, pg, redis_url):
    bound = keepalives().bound
    assert bound == 11  # 5 s idle, then 3 probes 2 s apart (cadences.TCP_KEEPALIVES_IDLE=5)
    deployment = Deployment(
        tmp_path, DATABASE_URL=pg.url, CELERY_BROKER_URL=redis_url,
        SCHEDULING_IDLE_IN_TRANSACTION_TIMEOUT=str(IDLE_TIMEOUT),
    )
    deployment.prefixes["stale"] = network.node_command()
    try:
        deployment.start_beat("stale", pause_after_publish=PAUSE)
        deployment.start_beat("rescuer")
        deployment.wait_ready()
        deployment.send("rescuer", signal.SIGSTOP)  # idle between ticks: the stale one claims
        pg.manage("shell", "--no-imports", "-c", CREATE_TASKS)
        deployment.wait_for_log("stale", "test pause: published", timeout=60)
        network.cut(database=True)  # its broker stays reachable: only the database is away
        cut_clock = time.monotonic()
        deployment.send("rescuer", signal.SIGCONT)
        wait_until(lambda: not _sessions(pg, "stale"), timeout=bound + 30)
        released_at = _now(pg)  # the server ended the silent session: its row locks are free
        dispatched = wait_until(
            lambda: (rows := [r for r in _runs(pg) if r[2] == "dispatched"])
            and len(rows) == 3 and rows,
            timeout=bound + 30,
        )
        deployment.wait_for_log("stale", "database unavailable", timeout=CUT_FOR)
        noticed = time.monotonic() - cut_clock
        wait_until(lambda: time.monotonic() - cut_clock >= CUT_FOR, timeout=CUT_FOR + 5)
        network.heal()
        deployment.wait_for_log("stale", "database reachable again", timeout=60)
        deployment.start_worker("worker", concurrency=2)
        wait_until(lambda: {r[2] for r in _runs(pg)} == {"succeeded"}
                   and sum(r[6] for r in _runs(pg)) == 3, timeout=90)
        time.sleep(2)  # anything executing twice would be logged by now
        alive = {name: deployment.alive(name) for name in ("stale", "rescuer")}
        stale_log = deployment.log_path("stale").read_text()
    finally:
        deployment.stop()
        for name in deployment.processes:
            print(f"--- {name} ---\n{deployment.tail(name, 25)}")

    assert alive == {"stale": True, "rescuer": True}
    stamp, published = PUBLISHED.search(stale_log).groups()
    assert sorted(published.split(",")) == sorted(r[1] for r in dispatched)
    # The claim's last statement came just before this line; the server heard nothing after it.
    last_heard = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC)
    released = (released_at - last_heard).total_seconds()
    waits = sorted((r[4] - last_heard).total_seconds() for r in dispatched)
    print(f"claim released {released:.2f} s after the replica's last statement, runs dispatched"
          f" by the rescuer {waits} s after it; the replica noticed {noticed:.1f} s after the cut")
    # The server gives up on the silent session after the keepalive bound (probes from 5 s idle,
    # every 2 s, 3 unanswered), which ends the claim; the rescuer's next tick dispatches the runs.
    # Without the keepalives the claim would last the 30 s idle-in-transaction timeout.
    assert bound - 1.0 <= released <= bound + 2.0
    # ``released`` is when this test saw the session gone (a poll later than the server ended it:
    # the rescuer dispatched 25 ms before it once, with two CPU hogs beside the suite); no run
    # can be dispatched before the keepalive bound has ended the claim.
    assert bound - 1.0 <= waits[0] and waits[-1] <= bound + SLACK
    # Its COMMIT after the pause went unacknowledged: tcp_user_timeout fails it within the bound,
    # not when the network returns (the retransmissions would go on for about 15 minutes); then
    # Django's atomic reconnects, which gives up after connect_timeout, and the line says both.
    assert PAUSE + bound - 2.0 <= noticed <= PAUSE + bound + CONNECT_TIMEOUT + SLACK
    assert stale_log.count("database unavailable") == 1
    assert (
        "database unavailable, retrying with backoff: connection timeout expired (after: consuming"
        " input failed: could not receive data from server: Connection timed out)"
    ) in stale_log
    final = _runs(pg)
    assert [r[0] for r in final] == ["cut-0", "cut-1", "cut-2"]  # nothing committed twice
    assert {(r[2], r[3], r[5], r[6]) for r in final} == {("succeeded", "rescuer", 1, 1)}
    executed = Counter(e["task_id"] for e in deployment.executions())
    assert executed == Counter({r[1]: 1 for r in final})  # the worker's own log: once each


CREATE_SLOW_TASK = """
from datetime import timedelta
from django_celery_beat.models import ClockedSchedule, PeriodicTask
from scheduling import ledger
slot = ClockedSchedule.objects.create(clocked_time=ledger.database_now() + timedelta(seconds=2))
PeriodicTask.objects.create(
    name="cut-worker", task="project.tasks.record", clocked=slot, one_off=True,
    kwargs='{"label": "w", "sleep": %s, "log_start": true}',
)
"""
BODY = 20.0  # the run's body: it ends while its worker is cut off
VISIBILITY = 25.0  # Redis hands the unacknowledged message to the other worker during the cut


def _guard_sessions(pg: PrivatePostgres) -> list[int]:
    rows = pg.query("SELECT pid FROM pg_stat_activity WHERE application_name = 'scheduling-guard'")
    return [row[0] for row in rows]


def test_a_worker_cut_off_mid_run_for_60_s(tmp_path, network, pg, redis_url):
    """The worker's host loses its network: packets to and from both the database and the
    broker are dropped, 60 s, from just after the body started.

    The server ends the guard's lock session after the keepalive bound, which frees the run's
    execution lock. Redis hands the message, never acknowledged, to the other worker after its
    visibility timeout: the guard there finds the run running, redelivered and its lock free,
    which under the default worker-loss policy (``fail``) means the run is closed "worker lost"
    and the copy is suppressed, not run. The body ends during the cut; its outcome cannot be
    written until the network returns, and the worker tries again for SCHEDULING_WORKER_LOST_AFTER
    (60 s): when it is back, the outcome replaces "worker lost". One execution in all.
    """
    bound = keepalives().bound
    deployment = Deployment(
        tmp_path, DATABASE_URL=pg.url, CELERY_BROKER_URL=redis_url,
        CELERY_BROKER_VISIBILITY_TIMEOUT=str(VISIBILITY), CELERY_BROKER_RESTORE_INTERVAL="2",
    )
    deployment.prefixes["cut"] = network.node_command()
    try:
        deployment.start_beat("replica")
        deployment.start_worker("cut", concurrency=1)
        deployment.wait_ready()
        pg.manage("shell", "--no-imports", "-c", CREATE_SLOW_TASK % BODY)
        start = wait_until(lambda: deployment.executions("start"), timeout=60)[0]
        [guard_session] = _guard_sessions(pg)
        network.cut(database=True, broker=True)
        cut_clock = time.monotonic()
        deployment.start_worker("other", concurrency=1)
        wait_until(lambda: guard_session not in _guard_sessions(pg), timeout=bound + 30)
        released_at = _now(pg)  # the server ended the lock session: the lock is free
        deployment.wait_for_log("other", "duplicate delivery suppressed", timeout=CUT_FOR)
        closed = _runs(pg)[0]
        wait_until(lambda: time.monotonic() - cut_clock >= CUT_FOR, timeout=CUT_FOR + 5)
        network.heal()
        wait_until(lambda: _runs(pg)[0][2] == "succeeded", timeout=90)
        time.sleep(2)  # anything executing twice would be logged by now
        logs = {name: deployment.log_path(name).read_text() for name in ("cut", "other")}
        outcome = pg.query("SELECT worker, reason, executions, suppressed FROM scheduling_run")
    finally:
        deployment.stop()
        for name in deployment.processes:
            print(f"--- {name} ---\n{deployment.tail(name, 25)}")

    started = datetime.fromtimestamp(start["at"], UTC)  # just after the lock was taken
    released = (released_at - started).total_seconds()
    print(f"execution lock freed {released:.2f} s after the body started")
    assert bound - 1.0 <= released <= bound + 2.0
    assert closed[2] == "failed"  # the other worker found the lock free: "worker lost"
    [(worker, reason, executions, suppressed)] = outcome
    assert worker.startswith("cut@")
    assert (reason, executions, suppressed) == (
        "outcome recorded after the run was closed as worker lost", 1, 1,
    )
    # The worker's own log: one start and one end, both the cut-off worker's.
    assert [e["task_id"] for e in deployment.executions("start")] == [start["task_id"]]
    assert [(e["task_id"], e["pgid"]) for e in deployment.executions()] == [
        (start["task_id"], start["pgid"])
    ]
    assert logs["other"].count("duplicate delivery suppressed") == 1
    # The write failed while cut off and was retried until made: the pool process logged losing
    # the database and reaching it again (scheduling.database_reach), and never gave the outcome up.
    assert " lost the database (connected to " in logs["cut"]
    assert " reached the database again at " in logs["cut"]
    assert "cannot record record_finished" not in logs["cut"]


HOLD_A_LOCK = """
import sys
from scheduling.guard import Attempt, liveness
assert liveness.try_lock(Attempt("held", 0))
print("locked", flush=True)
sys.stdin.readline()  # the test drops the server's replies, then says go
try:
    liveness.try_lock(Attempt("second", 0))
except Exception as exc:
    print("second lock:", " ".join(str(exc).split()), flush=True)
"""


def test_a_lock_session_whose_reply_is_lost_is_ended_within_the_bound(network, pg):
    """The server's reply goes unacknowledged: keepalives never start on its side, and without
    ``tcp_user_timeout`` its retransmissions would keep the session, and the execution lock it
    holds, for about 15 minutes. The guard's session sets it to the keepalive bound."""
    bound = keepalives().bound
    script = subprocess.Popen(
        [*network.node_command(), sys.executable, "manage.py", "shell", "--no-imports", "-c",
         HOLD_A_LOCK],
        cwd=ROOT, env={**os.environ, "DATABASE_URL": pg.url}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert script.stdout.readline().strip() == "locked"
        [session] = _guard_sessions(pg)
        network.cut(database=True, replies_only=True)  # its packets arrive, the replies do not
        script.stdin.write("go\n")
        script.stdin.flush()
        sent = time.monotonic()
        wait_until(lambda: session not in _guard_sessions(pg), timeout=bound + 30)
        ended = time.monotonic() - sent
        network.heal()
        output = script.communicate(timeout=60)[0]
    finally:
        if script.poll() is None:
            script.kill()
    print(f"the lock session ended {ended:.2f} s after its reply was lost; {output.strip()}")
    assert bound - 1.0 <= ended <= bound + 3.0
    assert "second lock:" in output  # the worker's side gave up too
