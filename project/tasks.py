"""Example tasks of the demo deployment."""

from __future__ import annotations

import json
import os
import time

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
def record(self, label: str = "", sleep: float = 0.0, fail: bool = False) -> str:
    """Append one JSON line per execution to $SCHEDULING_EXECUTION_LOG (tests count them).

    With ``fail=True`` it raises RuntimeError after recording, to show a failed run.
    """
    if sleep:
        time.sleep(sleep)
    path = os.environ.get("SCHEDULING_EXECUTION_LOG")
    if path:
        line = json.dumps(
            {
                "task_id": self.request.id,
                "label": label,
                "periodic_task_name": self.request.get("periodic_task_name"),
                "scheduled_for": self.request.get("scheduled_for"),
                "pid": os.getpid(),
                "at": time.time(),
            }
        )
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    if fail:
        raise RuntimeError(f"{label or 'record'} failed on purpose")
    return label
