"""Example tasks of the demo deployment."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC

from celery import shared_task
from django.core.mail import send_mail


@shared_task(bind=True)
def send_digest(self, recipient: str = "team@example.com") -> str:
    """Send a digest email (to the console backend in the demo)."""
    send_mail(
        subject=f"Digest for {self.request.get('scheduled_for', 'now')}",
        message="Everything ran exactly once.",
        from_email=None,
        recipient_list=[recipient],
    )
    return recipient


@shared_task(bind=True)
def record(
    self,
    label: str = "",
    sleep: float = 0.0,
    fail: bool = False,
    retry_times: int = 0,
    log_start: bool = False,
) -> str:
    """Append one JSON line per execution to $SCHEDULING_EXECUTION_LOG (tests count them).

    ``sleep`` seconds pass before the line is written; with ``log_start`` a line with
    ``"phase": "start"`` is written before them too. With ``fail=True`` it raises RuntimeError after
    recording, to show a failed run; with ``retry_times=n`` the first n executions end with
    ``self.retry(countdown=0.5)``.
    """
    if log_start:
        _log(self, label, "start")
    if sleep:
        time.sleep(sleep)
    _log(self, label, "end")
    if fail:
        raise RuntimeError(f"{label or 'record'} failed on purpose")
    if self.request.retries < retry_times:
        raise self.retry(countdown=0.5, max_retries=retry_times)
    return label


def _database_clock() -> str | None:
    """The database clock now (ISO 8601, UTC, microseconds), or None if it cannot be read."""
    from django.db import Error, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            (now,) = cursor.fetchone()
    except Error:  # the database away (an outage test): the line is written all the same
        return None
    return now.astimezone(UTC).isoformat(timespec="microseconds")


def _log(task, label: str, phase: str) -> None:
    path = os.environ.get("SCHEDULING_EXECUTION_LOG")
    if not path:
        return
    line = json.dumps(
        {
            "task_id": task.request.id,
            "label": label,
            "periodic_task_name": task.request.get("periodic_task_name"),
            "scheduled_for": task.request.get("scheduled_for"),
            "retries": task.request.retries,
            "phase": phase,
            "pid": os.getpid(),
            "pgid": os.getpgid(0),  # a worker's process group: its pool processes share it
            "at": time.time(),
            "db_at": _database_clock(),  # for histories (tools.history): the database's clock
        }
    )
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


@shared_task
def noop() -> None:
    """Do nothing: the benchmark's measure of what the worker side costs a run (bench/guard_cost)."""
