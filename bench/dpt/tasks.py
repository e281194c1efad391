"""The peer's task: one JSON line per execution, as ``project.tasks.record`` writes them.

``record`` is a django.tasks task guarded by django-periodic-tasks' ``@exactly_once`` (its
execution permit: the body runs only while the run's ``TaskExecution`` row is PENDING, and marks
it COMPLETED in the same transaction). The line (``tools.processes.read_executions``) carries
``at``, the time of the execution, and ``enqueued_at``, when the scheduler enqueued the run
(epoch seconds), so that the bench counts runs by the time of their send: the worker polls once a
second when idle (django-tasks-db's default), which would add up to a second more of spread.
"""

import json
import os
import time

from django.tasks import task
from django_periodic_tasks import exactly_once


@task(takes_context=True)
@exactly_once
def record(context, label: str = "") -> str:
    """Append the execution's line to $SCHEDULING_EXECUTION_LOG; return ``label``."""
    path = os.environ.get("SCHEDULING_EXECUTION_LOG")
    if path:
        result = context.task_result
        line = json.dumps({
            "task_id": str(result.id), "label": label, "phase": "end", "pid": os.getpid(),
            "at": time.time(), "enqueued_at": result.enqueued_at.timestamp(),
        })
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    return label
