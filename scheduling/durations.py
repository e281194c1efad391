"""Durations: settings and command options such as ``"30d"``, and timedeltas as seconds.

Imports nothing of ``scheduling``, so ``conf`` and every other module can use it without a cycle.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_duration(value: object) -> timedelta:
    """Return a timedelta for ``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"``, a number of
    seconds, or a timedelta.

    Raises ValueError for anything else, or a negative duration.
    """
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = timedelta(seconds=value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ValueError(
                f"not a duration: {value!r} (a number and a unit s, m, h, d or w: '30d', '12h')"
            )
        result = timedelta(seconds=float(match[1]) * _UNITS[match[2]])
    if result < timedelta(0):
        raise ValueError(f"a duration must not be negative: {value!r}")
    return result


def seconds(delta: timedelta | None) -> float | None:
    """Return ``delta`` in seconds, or None for None."""
    return None if delta is None else delta.total_seconds()
