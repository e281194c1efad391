"""Worker side: record each run's start, retries and outcome on its ledger row, by task id.

Connected in ``SchedulingConfig.ready()``. Tasks not sent by the scheduler (no ``scheduling_run``
header) return at the first check and cost nothing more.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from scheduling import ledger
from scheduling.messages import HEADER_RUN
from scheduling.models import Run

logger = logging.getLogger(__name__)


def _is_scheduled(task: Any) -> bool:
    request = getattr(task, "request", None)
    return request is not None and request.get(HEADER_RUN) is not None


def _short(exc: BaseException | None) -> str:
    return "" if exc is None else f"{type(exc).__name__}: {exc}"


@signals.task_prerun.connect(dispatch_uid="scheduling.task_prerun")
def _on_prerun(sender: Any = None, task_id: str = "", task: Any = None, **_: Any) -> None:
    if _is_scheduled(task):
        ledger.record_started(task_id, task.request.hostname or "")


@signals.task_success.connect(dispatch_uid="scheduling.task_success")
def _on_success(sender: Any = None, **_: Any) -> None:
    if _is_scheduled(sender):
        ledger.record_finished(sender.request.id, Run.Status.SUCCEEDED)


@signals.task_failure.connect(dispatch_uid="scheduling.task_failure")
def _on_failure(
    sender: Any = None, task_id: str = "", exception: BaseException | None = None, **_: Any
) -> None:
    if _is_scheduled(sender):
        ledger.record_finished(task_id, Run.Status.FAILED, _short(exception))


@signals.task_retry.connect(dispatch_uid="scheduling.task_retry")
def _on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    if request is not None and request.get(HEADER_RUN) is not None:
        ledger.record_retry(request.id, str(reason or ""))
