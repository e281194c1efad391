"""Django settings of the benchmark's worker without the guard: the example project's, less it.

``bench.guard_cost`` runs one worker with these to measure what the guard costs: the worker
signals still write each run's start and outcome (``scheduling.worker``), the guard's decision
and execution lock are left out.
"""

from __future__ import annotations

from project.settings import *

CELERY_TASK_ANNOTATIONS: list[str] = []
