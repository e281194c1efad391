"""Celery beat's hooks wrapped at class level, as sentry-sdk wraps them, for the tests.

    celery -A project beat -S tests.acceptance.hooked_beat:LedgerScheduler

Importing this module wraps ``celery.beat.Scheduler.apply_entry`` (what sentry-sdk's Crons
integration wraps), ``celery.beat.Scheduler.apply_async`` and ``LedgerScheduler.apply_async``
(what it wraps on RedBeat's scheduler) in the replica's process. Each call logs one line
``beat hook <method> <JSON>``: the entry's name, task, schedule (``repr``), args, kwargs and
options, with its task id, then calls the wrapped method, so a test counts what every hook saw.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import Any

from celery import beat

from scheduling.schedulers import LedgerScheduler

logger = logging.getLogger(__name__)

#: The start of each logged line; the JSON follows it.
PREFIX = "beat hook "


def described(entry: Any) -> dict[str, Any]:
    """What a hook is given, as JSON values: the entry's fields and its options."""
    return {
        "name": entry.name, "task": entry.task, "schedule": repr(entry.schedule),
        "args": list(entry.args), "kwargs": dict(entry.kwargs),
        "options": json.loads(json.dumps(entry.options, default=str)),
    }


def _counted(label: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def counted(self: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
        logger.warning("%s%s %s", PREFIX, label, json.dumps(described(entry)))
        return method(self, entry, *args, **kwargs)

    return counted


beat.Scheduler.apply_entry = _counted("Scheduler.apply_entry", beat.Scheduler.apply_entry)
beat.Scheduler.apply_async = _counted("Scheduler.apply_async", beat.Scheduler.apply_async)
LedgerScheduler.apply_async = _counted(  # type: ignore[method-assign]
    "LedgerScheduler.apply_async", LedgerScheduler.apply_async
)

__all__ = ["LedgerScheduler"]
