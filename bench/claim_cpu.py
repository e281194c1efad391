"""The CPU one claim of 100 due runs costs this process: ``python -m bench.claim_cpu``.

A development figure, not a scenario of the report: what ``ledger.claim_and_dispatch`` itself
costs in Python (the claim query's rows turned into runs and tasks, the misfire and overlap
decisions, the messages built, the ledger's writes), with a publish that sends nothing, so the
broker's client is left out. It runs in a database of its own (``env.bench_database``: the
server DATABASE_URL names, else the embedded one) with ``TASKS`` periodic tasks: a third
interval tasks, a third crontab tasks in a zone of their own, a third interval tasks with a
``TaskPolicy`` (overlap skip, jitter). Each round makes every pending run due (``due_at`` one
second ago on the database clock) and claims them 100 at a time on a replica's session
(``ledger.configure_session``: prepared, generic plans) with a ``TaskBook``, as a replica does;
``time.process_time`` around each claim. Prints the median, mean and best ms of CPU per claim
of 100 runs over ``ROUNDS`` rounds (the first, which prepares the statements, left out).

Only the app's public names are used, so the same file measures another checkout of the
repository: ``PYTHONPATH=<checkout> python /path/to/claim_cpu.py``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from datetime import timedelta

TASKS = 1000
ROUNDS = 20
BATCH = 100
GRACE = timedelta(seconds=60)


def _tasks(count: int) -> None:
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

    from scheduling.models import TaskPolicy

    hourly, _ = IntervalSchedule.objects.get_or_create(every=3600, period=IntervalSchedule.SECONDS)
    cron, _ = CrontabSchedule.objects.get_or_create(minute="0", hour="*", timezone="Europe/Paris")
    for i in range(count):
        schedule = {"crontab": cron} if i % 3 == 1 else {"interval": hourly}
        task = PeriodicTask.objects.create(
            name=f"claim-cpu-{i}", task="project.tasks.record", kwargs=f'{{"n": {i}}}',
            **schedule,
        )
        if i % 3 == 2:
            TaskPolicy.objects.create(
                periodic_task=task, overlap_policy=TaskPolicy.Overlap.SKIP, jitter_seconds=5
            )


def _make_due() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scheduling_run SET status = 'succeeded', finished_at = clock_timestamp()"
            " WHERE status = 'dispatched'"
        )  # no worker: the last round's runs end, so overlap skip lets the next ones go
        cursor.execute(
            "UPDATE scheduling_run SET due_at = clock_timestamp() - interval '1 second'"
            " WHERE status = 'pending'"
        )


def measure(tasks: int = TASKS, rounds: int = ROUNDS) -> list[float]:
    """Return the CPU seconds of each full claim of ``BATCH`` runs after the first round."""
    from scheduling import ledger

    _tasks(tasks)
    ledger.reconcile(GRACE)
    ledger.configure_session()
    book = ledger.TaskBook()
    costs: list[float] = []
    for number in range(rounds + 1):
        _make_due()
        while True:
            started = time.process_time()
            done = ledger.claim_and_dispatch(
                lambda message: None, replica_id="claim-cpu:1", batch_size=BATCH, grace=GRACE,
                book=book,
            )
            spent = time.process_time() - started
            if not done:
                break
            statuses = {d.status for d in done}
            if statuses != {"dispatched"}:
                raise RuntimeError(f"a claim ended runs otherwise: {statuses}")
            if number and len(done) == BATCH:
                costs.append(spent)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_cpu", description=__doc__)
    parser.add_argument("--tasks", type=int, default=TASKS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    from bench import env

    with env.bench_database():
        logging.getLogger("scheduling").setLevel(logging.WARNING)
        costs = measure(args.tasks, args.rounds)
    ms = [c * 1000 for c in costs]
    print(
        f"CPU per claim of {BATCH} runs: median {statistics.median(ms):.2f} ms,"
        f" mean {statistics.fmean(ms):.2f} ms, best {min(ms):.2f} ms ({len(ms)} claims)"
    )


if __name__ == "__main__":
    main()
