"""A baseline, not product code: the seed's system, stock beat in every container behind a lock.

What the project replaced, kept in ``bench/`` so the benchmark can count what it does: every
container runs a stock django-celery-beat ``DatabaseScheduler``, and each run is guarded by a
Redis lock with a TTL, the way the seed's author describes it: before sending a due run, the
beat takes the periodic task's lock without waiting (pottery's ``Redlock``, one Redis master);
when the lock is held, another container has sent this run, so it skips; the lock is never
released, it expires after its TTL, which frees the task's next run.

Run as ``celery -A project beat -S bench.redlock_beat:RedlockScheduler`` with the environment:

- ``BENCH_REDLOCK_URL``: the Redis that holds the locks;
- ``BENCH_REDLOCK_TTL``: the lock's time to live, in seconds (the benchmark uses half the tasks'
  interval: long enough to cover the containers' spread of send times, short enough to free the
  next run);
- ``BENCH_REDLOCK_PREFIX``: the locks' key prefix (one per deployment).

Each decision is logged at info level, after stock beat's "Sending due task" line: ``redlock:
sent <task>`` or ``redlock: skipped <task> (lock held)``; the benchmark counts them to find the
busiest container. Nothing else of stock beat changes: each container keeps its own schedule in
memory (next send = last send + interval), so a container that was paused sends what it finds
overdue as soon as it wakes, and the lock alone decides whether that copy goes out.
"""

from __future__ import annotations

import logging
import os

from django_celery_beat.schedulers import DatabaseScheduler
from pottery import Redlock
from redis import Redis

logger = logging.getLogger(__name__)


class RedlockScheduler(DatabaseScheduler):
    """Stock ``DatabaseScheduler`` that sends a due run only when it takes the task's Redis lock."""

    def __init__(self, *args, **kwargs) -> None:
        self._redis = Redis.from_url(os.environ["BENCH_REDLOCK_URL"])
        self._ttl = float(os.environ["BENCH_REDLOCK_TTL"])
        self._prefix = os.environ.get("BENCH_REDLOCK_PREFIX", "bench-redlock")
        super().__init__(*args, **kwargs)

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        """Send ``entry`` when its lock is free (and keep the lock until its TTL); else skip."""
        lock = Redlock(
            key=f"{self._prefix}:{entry.name}", masters={self._redis},
            auto_release_time=self._ttl,
        )
        if not lock.acquire(blocking=False):
            logger.info("redlock: skipped %s (lock held)", entry.name)
            return None
        logger.info("redlock: sent %s", entry.name)
        return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
