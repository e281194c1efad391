"""Loaded by the children ``tests.faketime`` skews: ``time.sleep`` without clock_nanosleep.

libfaketime 0.9.10 (Debian 12) with ``FAKETIME_DONT_FAKE_MONOTONIC`` fails
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which ``time.sleep`` uses, with EINVAL;
``select`` with a timeout is relative and unaffected. Only the sleep changes: the wall clock is
libfaketime's, the monotonic clock the kernel's.
"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
