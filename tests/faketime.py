"""Child processes with a skewed wall clock: Debian's libfaketime, preloaded.

``environment("+1h")`` is what a child needs in its environment to see its wall clock an hour
ahead (``time.time()``, ``datetime.now()``, the log's timestamps); its monotonic clock is left
alone, as on a real host whose wall clock is wrong. Debian's ``faketime`` package installs the
library (``apt-get install -y faketime``).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from tests.needs import missing

#: Where Debian's libfaketime package puts the multi-threaded library (Celery runs threads).
PATTERN = "/usr/lib/*/faketime/libfaketimeMT.so.1"
#: A folder whose ``sitecustomize`` gives the children a ``time.sleep`` libfaketime cannot break.
SITE = Path(__file__).resolve().parent / "faketime_site"


def library() -> str | None:
    """Return the path of libfaketimeMT, or None when the faketime package is missing."""
    found = sorted(glob.glob(PATTERN))
    return found[0] if found else None


def require() -> str:
    """Return the library's path; skip the test without it, fail it instead with CI set."""
    path = library()
    if path is None:
        missing("libfaketime is missing: install Debian's faketime (apt-get install -y faketime)")
    return path


def environment(offset: str, path: str) -> dict[str, str]:
    """Return the environment that shifts a child's wall clock by ``offset`` ("+1h", "-1h").

    The monotonic clock stays the kernel's: faked, libfaketime 0.9.10 shifts it too, and every
    timed lock wait in Python (``sem_clockwait`` on CLOCK_MONOTONIC, which it does not intercept)
    then lasts the offset. Left alone, its ``clock_nanosleep`` fails ``time.sleep`` with EINVAL,
    so ``faketime_site/sitecustomize.py`` sleeps with ``select`` instead. ``TZ=UTC`` makes the
    child's log timestamps UTC, so a test can read its clock from them.
    """
    python_path = os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))
    return {
        "LD_PRELOAD": path,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": python_path,
        "TZ": "UTC",
    }
