"""The capped, jittered backoff of a process retrying the database or the broker."""

from __future__ import annotations

import random
from collections.abc import Callable

_BACKOFF_BASE = 0.5


def retry_delay(
    failures: int, cap: float, draw: Callable[[], float] = random.random
) -> float:
    """Return the seconds to wait after the ``failures``-th failed tick in a row (1, 2, ...).

    The bound doubles from 0.5 s per failure up to ``cap`` seconds
    (``cadences.RETRY_BACKOFF_MAX``); the wait is drawn uniformly from its upper half
    (``draw()`` in [0, 1)), so replicas that failed together do not retry in step, and none
    waits less than half the bound: [0.25, 0.5), [0.5, 1), [1, 2), ... then [cap/2, cap).
    """
    bound = min(cap, _BACKOFF_BASE * 2 ** min(failures - 1, 30))
    return bound * (0.5 + draw() / 2)
