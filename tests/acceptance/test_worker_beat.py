"""``celery worker -B``: beat embedded in every worker, as a team running beat in each container
does. Three ``worker -B --scheduler scheduling.schedulers:LedgerScheduler`` processes, a few tasks every
2 s and a ``* * * * *`` crontab for about a minute: every slot is dispatched once and executed
once, counted from the workers' own Celery logs."""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import timedelta
from itertools import pairwise

import pytest
from django_celery_beat.models import PeriodicTask

from scheduling import ledger
from scheduling.models import Run
from tests.acceptance.deployment import ROOT, Deployment, drain
from tools.processes import READY

# Run in .ci/run's first pass (the SQL transport) and on RabbitMQ ('broker'), not again on Redis.
pytestmark = [
    pytest.mark.acceptance, pytest.mark.once, pytest.mark.broker,
    pytest.mark.django_db(transaction=True),
]

WORKERS = ("app-1", "app-2", "app-3")
RUN_SECONDS = 62
#: A task execution as Celery's worker logs it.
SUCCEEDED = re.compile(r"Task project\.tasks\.record\[([0-9a-f-]{36})\] succeeded in")


def test_three_workers_with_embedded_beat_run_every_slot_once(
    deployment: Deployment, make_task
):
    for name in WORKERS:
        deployment.start_worker_beat(name, concurrency=2)
    deployment.wait_ready()
    for name in WORKERS:
        deployment.wait_for_log(name, READY["beat"], timeout=60)

    every_2s = [make_task(every=2, name=f"every-2s-{i}") for i in range(4)]
    minutely = make_task(cron="* * * * *", name="every-minute")
    time.sleep(RUN_SECONDS)
    last_alive = ledger.database_now()
    PeriodicTask.objects.update(enabled=False)  # the replicas cancel what is still pending
    time.sleep(3)
    stop = ledger.database_now()
    drain()
    deployment.stop(*WORKERS, warm=True)

    runs = list(Run.objects.exclude(status__in=[Run.Status.PENDING, Run.Status.CANCELLED])
                .order_by("scheduled_for"))
    executed = Counter(
        task_id for name in WORKERS
        for task_id in SUCCEEDED.findall(deployment.log_path(name).read_text())
    )
    assert [task_id for task_id, n in executed.items() if n > 1] == []
    assert sorted(executed) == sorted(run.task_id for run in runs)
    assert {run.status for run in runs} == {Run.Status.SUCCEEDED}
    slots = Counter((run.periodic_task_id, run.scheduled_for) for run in runs)
    assert [slot for slot, n in slots.items() if n > 1] == []

    for task in every_2s:  # an unbroken chain of slots 2 s apart, up to the end of the window
        chain = [run.scheduled_for for run in runs if run.periodic_task_id == task.pk]
        assert {b - a for a, b in pairwise(chain)} == {timedelta(seconds=2)}, task.name
        assert chain[0] <= task.date_changed + timedelta(seconds=2)
        assert chain[-1] >= last_alive - timedelta(seconds=3.5), (task.name, chain[-1])
    minute_slots = {run.scheduled_for for run in runs if run.periodic_task_id == minutely.pk}
    first = minutely.date_changed.replace(second=0, microsecond=0) + timedelta(minutes=1)
    boundaries = [first + timedelta(minutes=i) for i in range(2)]
    assert {b for b in boundaries if b <= last_alive - timedelta(seconds=1.5)} <= minute_slots
    assert minute_slots <= {b for b in boundaries if b <= stop}
    assert len(minute_slots) == 1 or len(minute_slots) == 2

    claimed = Counter(run.claimed_by for run in runs)
    print(f"runs={len(runs)} executed={sum(executed.values())} claimed by {dict(claimed)}")
    assert set(claimed) <= set(WORKERS) | {"adopted"}
    assert len(set(claimed) & set(WORKERS)) >= 2
    assert sorted(path.name for path in ROOT.glob("scheduling.schedulers*")) == []  # no statedb
