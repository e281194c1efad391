"""Issue 18 acceptance 4: replicas and workers whose clocks are an hour off, for two minutes.

A replica and a worker run an hour ahead, another replica and worker an hour behind (libfaketime,
``tests.faketime``), beside a replica and a worker on the right time, with interval and crontab
tasks. The database clock decides: no run is dispatched before its due moment, none executes
twice, every slot of the window executes once, and every ledger time, the lateness and the
replicas page's last tick are the database's. The skew itself is checked in each process (its log
timestamps, its executions' ``time.time()``), so the test cannot pass because faketime did
nothing.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django_celery_beat.models import PeriodicTask

from scheduling import health, ledger
from scheduling.models import Replica, Run
from tests import faketime
from tests.acceptance.deployment import Deployment, drain, executed_once, wait_until

pytestmark = [
    pytest.mark.acceptance,
    # The clocks are the subject (the database's and the processes' skewed ones): the same on
    # any broker, so .ci/run runs it in its first pass only.
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(420),  # about 3 minutes; processes start slowly on a loaded machine
]

RUN_SECONDS = 120
HOUR = timedelta(hours=1)
#: Process name -> its clock's offset from the database's.
SKEW = {"ahead": HOUR, "behind": -HOUR, "normal": timedelta(0)}
FAKETIME = {"ahead": "+1h", "behind": "-1h"}
#: Seconds a log line or an execution's own timestamp may stray from the database window around
#: it (same host: the log's milliseconds, a write after the DB's statement).
SLACK = timedelta(seconds=1)
#: A replica is shown stale after 3 heartbeat intervals (5 s by default) without a tick.
STALE = timedelta(seconds=15)
#: The beat_schedule entry the ahead replica syncs (tests/acceptance/settings_skew.py).
SYNCED = "skew: synced every 4 s"
SYNCING = "tests.acceptance.settings_skew"
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ", re.MULTILINE)


def _env(kind: str, library: str) -> dict[str, str]:
    if kind == "normal":
        return {"TZ": "UTC"}
    return faketime.environment(FAKETIME[kind], library)


def _logged_at(deployment: Deployment, name: str, text: str) -> datetime:
    """The process's own timestamp (UTC) of the first line of ``name``'s log holding ``text``."""
    for line in deployment.log_path(name).read_text(errors="replace").splitlines():
        match = _LOG_TIME.match(line)
        if match and text in line:
            return datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
    raise AssertionError(f"{text!r} not in {name}'s log:\n{deployment.tail(name)}")


def _replicas_page(client) -> dict[str, tuple[int, str]]:
    """Replica id -> (seconds since its last tick, state), as the replicas admin page shows."""
    user = User.objects.create_superuser("skew", "skew@example.com", "pw")
    client.force_login(user)
    html = client.get(reverse("admin:scheduling_replica_changelist")).content.decode()
    rows = re.findall(
        r'<th class="field-id"><a [^>]*>([^<]+)</a></th>.*?\((\d+) s ago\).*?'
        r"replica-state replica-(\w+)",
        html, re.DOTALL,
    )
    return {replica: (int(age), state) for replica, age, state in rows}


def test_replicas_and_workers_an_hour_off_dispatch_nothing_early_or_twice(
    deployment: Deployment, make_task, client
):
    library = faketime.require()
    opened = ledger.database_now()

    # Every process starts at once; only the ahead replica syncs the beat_schedule entry, so it
    # writes that periodic task from its own process, whose clock says an hour later.
    for kind in ("ahead", "behind", "normal"):
        settings = {"DJANGO_SETTINGS_MODULE": SYNCING} if kind == "ahead" else {}
        deployment.start_beat(f"replica-{kind}", **_env(kind, library), **settings)
        deployment.start_worker(f"worker-{kind}", concurrency=1, **_env(kind, library))
    deployment.wait_ready(timeout=120)
    wait_until(lambda: PeriodicTask.objects.filter(name=SYNCED).exists(), timeout=30)
    ready = ledger.database_now()

    # Each process's clock really is off: its own log timestamps, against the database window
    # in which it logged them.
    for name in deployment.processes:
        text = "beat: Starting..." if name.startswith("replica") else "ready."
        skew = SKEW[name.split("-", 1)[1]]
        logged = _logged_at(deployment, name, text)
        assert opened + skew - SLACK <= logged <= ready + skew + SLACK, (name, logged, opened)

    synced = PeriodicTask.objects.get(name=SYNCED)
    intervals = {
        synced: 4,
        make_task(every=3, name="skew: every 3 s"): 3,
        make_task(every=5, name="skew: every 5 s"): 5,
        # Its message's expiry must be counted on the database clock: from a replica an hour
        # behind it would have passed already (Celery counts expire_seconds from the publisher's
        # clock), for a worker that is on time or ahead.
        make_task(every=4, name="skew: expiring", expire_seconds=5400): 4,
    }
    minutely = make_task(cron="* * * * *", name="skew: every minute")

    wait_until(
        lambda: ledger.database_now() >= ready + timedelta(seconds=RUN_SECONDS), RUN_SECONDS + 60,
        interval=1.0,
    )
    # The skewed replicas' last ticks, as the replicas page and the health probe see them.
    page = _replicas_page(client)
    verdict = health.check(max_tick_age=30, max_overdue=120)
    ticks = dict(Replica.objects.values_list("id", "last_tick_at"))
    page_read = ledger.database_now()

    deployment.stop("replica-ahead", "replica-behind")
    last_alive = ledger.database_now()
    deployment.stop("replica-normal")
    stop = ledger.database_now()
    drain(timeout=60)
    deployment.stop("worker-ahead", "worker-behind", "worker-normal")
    closed = ledger.database_now()

    assert {name: state for name, (_, state) in page.items()} == {
        "replica-ahead": "live", "replica-behind": "live", "replica-normal": "live"
    }
    # Live means a tick within 3 heartbeat intervals (15 s) by the database clock: an hour off
    # either way would read stale, or "-3600 s ago".
    assert max(age for age, _ in page.values()) < STALE.total_seconds(), page
    assert verdict.healthy, verdict
    for replica in ("replica-ahead", "replica-behind", "replica-normal"):
        assert page_read - STALE <= ticks[replica] <= page_read, (replica, ticks)

    runs = list(Run.objects.exclude(status=Run.Status.PENDING).order_by("scheduled_for"))
    executions = deployment.executions()

    # Executed once each, counted by the workers, and exactly the runs the ledger dispatched.
    by_id = executed_once(runs, executions)
    assert Counter(r.status for r in runs) == {Run.Status.SUCCEEDED: len(runs)}

    # Nothing dispatched before its due moment by the database clock; lateness the database's.
    early = [(r.periodic_task_name, r.scheduled_for, r.dispatched_at) for r in runs
             if r.dispatched_at < r.due_at or r.due_at < r.scheduled_for]
    assert early == []
    lateness = sorted(r.lateness.total_seconds() for r in runs)
    print(f"runs={len(runs)} p50={lateness[len(lateness) // 2]:.3f}s max={lateness[-1]:.3f}s")
    assert 0 <= lateness[0] and lateness[-1] < 5.0

    # Every ledger time falls in the database window of the test, none an hour off.
    for run in runs:
        for field in ("scheduled_for", "due_at", "planned_at", "dispatched_at", "started_at",
                      "finished_at"):
            value = getattr(run, field)
            assert opened <= value <= closed, (run.periodic_task_name, field, value, opened)
    assert opened <= synced.date_changed <= ready

    # Each skewed process took part: both skewed replicas claimed runs, both skewed workers ran
    # some, and a skewed worker's own clock (time.time() in its execution record) was off.
    claimed = Counter(r.claimed_by for r in runs)
    assert claimed["replica-ahead"] >= 1 and claimed["replica-behind"] >= 1, claimed
    workers = {deployment.processes[f"worker-{kind}"].pid: kind for kind in SKEW}
    ran = Counter(workers[e["pgid"]] for e in executions)
    print(f"claimed by {dict(claimed)}; executed by {dict(ran)}")
    assert ran["ahead"] >= 1 and ran["behind"] >= 1, ran
    for execution in executions:
        run = by_id[execution["task_id"]]
        skew = SKEW[workers[execution["pgid"]]]
        at = datetime.fromtimestamp(execution["at"], UTC)
        assert run.started_at + skew - SLACK <= at <= run.finished_at + skew + SLACK, (
            execution, run.started_at, run.finished_at,
        )
        assert run.worker.startswith(f"worker-{workers[execution['pgid']]}@")

    # No slot missing: each interval task's slots form an unbroken chain across the window, from
    # one interval after its creation (by the database clock) to the last replica's stop.
    for task, every in intervals.items():
        chain = [r.scheduled_for for r in runs if r.periodic_task_id == task.pk]
        assert chain, task.name
        gaps = {b - a for a, b in pairwise(chain)}
        assert gaps == {timedelta(seconds=every)}, (task.name, gaps)
        assert chain[0] <= task.date_changed + timedelta(seconds=every), (task.name, chain[0])
        assert chain[-1] >= last_alive - timedelta(seconds=every + 1.5), (task.name, chain[-1])
    minute_slots = {r.scheduled_for for r in runs if r.periodic_task_id == minutely.pk}
    first = minutely.date_changed.replace(second=0, microsecond=0) + timedelta(minutes=1)
    boundaries = [first + timedelta(minutes=i) for i in range(4)]
    assert {b for b in boundaries if b <= last_alive - timedelta(seconds=1.5)} <= minute_slots
    assert minute_slots <= {b for b in boundaries if b <= stop}
    assert len(minute_slots) >= 1
