"""Issue 5 acceptance 3: PostgreSQL stopped and started again while beat replicas run.

The replicas (and the worker, on Redis) use a PostgreSQL server of this test's own
(``PrivatePostgres``), so the test can stop it whatever DATABASE_URL says; the broker stays where
the suite has it (Redis, or kombu's SQL transport on the suite's database), so only the database
goes away. No replica may exit; each logs the outage once and the recovery once, one line each;
runs resume within 5 s of the server's return, and the slots missed meanwhile follow the misfire
policies.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from tests.acceptance.deployment import Deployment, broker_is_redis, wait_until
from tests.acceptance.outages import assert_misfire_policies
from tests.acceptance.private_postgres import PrivatePostgres

pytestmark = [pytest.mark.acceptance]

OUTAGE_SECONDS = 10
EVERY = timedelta(seconds=1)
GRACE = timedelta(seconds=3)
RESUME_BOUND = 5.0
# The worker side runs on Redis only: kombu's SQL transport breaks (SQLAlchemy's
# "IllegalStateChangeError: commit() already in progress" in its _get) when the guard requeues
# messages while the database is away, and its consumer stops. The replicas are the point here.
WITH_WORKER = broker_is_redis()
DONE = "succeeded" if WITH_WORKER else "dispatched"

# Three interval tasks every second from three seconds ahead: misfire policies coalesce and
# skip with a 3 s grace, and the default policy (60 s grace, longer than the outage).
CREATE_TASKS = """
from datetime import timedelta
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from scheduling import ledger
from scheduling.models import TaskPolicy
start = ledger.database_now().replace(microsecond=0) + timedelta(seconds=3)
every, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
for policy in ("coalesce", "skip", "in_grace"):
    task = PeriodicTask.objects.create(
        name=policy, task="project.tasks.record", interval=every, start_time=start
    )
    if policy != "in_grace":
        TaskPolicy.objects.create(
            periodic_task=task, misfire_policy=policy, misfire_grace_seconds=3
        )
print(start.isoformat())
"""


@dataclass(frozen=True)
class Row:
    """One run as the private server's ledger has it."""

    periodic_task_name: str
    scheduled_for: datetime
    status: str
    dispatched_at: datetime | None
    finished_at: datetime | None
    slots: int
    reason: str
    task_id: str

    @property
    def lateness(self) -> timedelta | None:
        return None if self.dispatched_at is None else self.dispatched_at - self.scheduled_for


def _ledger(pg: PrivatePostgres) -> list[Row]:
    rows = pg.query(
        "SELECT periodic_task_name, scheduled_for, status, dispatched_at, finished_at, slots,"
        " reason, task_id FROM scheduling_run ORDER BY scheduled_for, id"
    )
    return [Row(*row) for row in rows]


def _now(pg: PrivatePostgres) -> datetime:
    return pg.query("SELECT clock_timestamp()")[0][0]


def _drain(pg: PrivatePostgres, timeout: float = 30.0) -> None:
    """Wait until the worker has finished every dispatched run of the private server's ledger."""
    unfinished = (
        "SELECT periodic_task_name, scheduled_for, status, reason FROM scheduling_run"
        " WHERE status IN ('dispatched', 'running', 'retrying')"
    )
    try:
        wait_until(lambda: not pg.query(unfinished), timeout)
    except AssertionError:
        raise AssertionError(f"runs never finished: {pg.query(unfinished)}") from None


def _back(deployment: Deployment, name: str) -> bool:
    """Whether replica ``name`` logged that the database is reachable again."""
    return "database reachable again" in deployment.log_path(name).read_text()


@pytest.fixture
def pg():
    server = PrivatePostgres()
    try:
        yield server
    finally:
        server.close()


def test_database_restart_keeps_replicas_up_and_resumes_within_5_s(tmp_path, pg):
    pg.manage("migrate", "--verbosity", "0")
    deployment = Deployment(tmp_path, DATABASE_URL=pg.url)
    replicas = ["replica-1", "replica-2"]
    try:
        for name in replicas:
            deployment.start_beat(name)
        if WITH_WORKER:
            deployment.start_worker("worker-1", concurrency=4)
        deployment.wait_ready()
        output = pg.manage("shell", "--no-imports", "-c", CREATE_TASKS)
        start = datetime.fromisoformat(output.strip())

        def out() -> int:
            return pg.query("SELECT count(*) FROM scheduling_run WHERE status = %s", [DONE])[0][0]

        wait_until(lambda: out() >= 9, timeout=30)
        down = _now(pg)
        pg.stop()
        time.sleep(OUTAGE_SECONDS)
        pg.start()
        # When the server started, not when this process got to ask: a replica can reach it first
        # and dispatch before then, and that dispatch is not "during the outage".
        up = pg.query("SELECT pg_postmaster_start_time()")[0][0]

        def due_at_return() -> int:
            return pg.query(
                "SELECT count(*) FROM scheduling_run WHERE status = 'pending'"
                " AND scheduled_for <= %s",
                [up],
            )[0][0]

        wait_until(lambda: due_at_return() == 0, timeout=15)
        # A replica in backoff ticks again within cadences.RETRY_BACKOFF_MAX (3 s) of its last
        # failed tick; the other may have claimed everything by then. Each says it is back at
        # its first tick that reached the server: wait for that, not a fixed time.
        wait_until(lambda: all(_back(deployment, name) for name in replicas), timeout=15)
        time.sleep(2)
        alive = {name: deployment.processes[name].poll() for name in replicas}
        deployment.stop(*replicas)
        if WITH_WORKER:
            _drain(pg)
            deployment.stop("worker-1")
        else:
            from project.celery import app

            with app.connection_for_write() as conn:
                conn.SimpleQueue(deployment.queue).clear()
    finally:
        deployment.stop()
        for name in deployment.processes:
            print(f"--- {name} ---\n{deployment.tail(name, 15)}")

    assert alive == {name: None for name in replicas}  # no replica exited

    # One clear line per state change and replica: down once, back once, no traceback.
    for name in replicas:
        log = deployment.log_path(name).read_text()
        down_lines = re.findall(r"ERROR scheduling\.schedulers: database unavailable, .*", log)
        back_lines = re.findall(r"WARNING scheduling\.schedulers: database reachable again .*", log)
        assert (len(down_lines), len(back_lines)) == (1, 1), name
        assert "Traceback" not in log, name
        after_start = log.split("beat: Starting...", 1)[1].splitlines()[1:]
        assert [line for line in after_start if not re.match(r"\[?\d{4}-\d\d-\d\d ", line)] == []

    rows = _ledger(pg)
    by_task = {name: [r for r in rows if r.periodic_task_name == name] for name in
               ("coalesce", "skip", "in_grace")}

    # Runs resume within RESUME_BOUND seconds of the database's return.
    resumed = min(r.dispatched_at for r in rows if r.dispatched_at and r.dispatched_at >= up)
    print(f"first dispatch {(resumed - up).total_seconds():.3f} s after the database returned")
    assert (resumed - up).total_seconds() < RESUME_BOUND
    assert [r for r in rows if r.dispatched_at and down < r.dispatched_at < up] == []

    assert_misfire_policies(by_task, start=start, every=EVERY, grace=GRACE, down=down, up=up)

    assert {r.status for r in rows} <= {DONE, "missed", "pending"}
    if not WITH_WORKER:
        return
    # Nothing executed twice; everything dispatched executed once and succeeded.
    executed = Counter(e["task_id"] for e in deployment.executions())
    assert [tid for tid, n in executed.items() if n > 1] == []
    not_executed = [r for r in rows if r.dispatched_at is not None and r.task_id not in executed]
    assert [(r.periodic_task_name, r.status, r.scheduled_for, r.reason) for r in not_executed] == []
    assert set(executed) == {r.task_id for r in rows if r.dispatched_at is not None}
