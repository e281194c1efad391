"""Django settings of the benchmark's RedBeat processes: the example project's, plus RedBeat's.

RedBeat reads its configuration from the Celery app (``redbeat_*``; here ``CELERY_REDBEAT_*``
through ``config_from_object``). The benchmark sets, per deployment:

- ``BENCH_REDBEAT_URL``: the Redis that holds RedBeat's schedule and lock;
- ``BENCH_REDBEAT_PREFIX``: RedBeat's key prefix (``redbeat_key_prefix``);
- ``BENCH_REDBEAT_LOCK_TIMEOUT``: seconds, unset for RedBeat's default (5 x the beat's maximum
  loop interval of 300 s: 1,500 s).
"""

from __future__ import annotations

import os

from project.settings import *

CELERY_REDBEAT_REDIS_URL = os.environ.get("BENCH_REDBEAT_URL", "")
CELERY_REDBEAT_KEY_PREFIX = os.environ.get("BENCH_REDBEAT_PREFIX", "redbeat")
if os.environ.get("BENCH_REDBEAT_LOCK_TIMEOUT"):
    CELERY_REDBEAT_LOCK_TIMEOUT = int(os.environ["BENCH_REDBEAT_LOCK_TIMEOUT"])
