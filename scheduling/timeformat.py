"""The one way this app shows an instant to a person: UTC, with the zone.

``2026-12-07 13:40:13.984 UTC`` to the millisecond (runs, pauses, edits: when something
happened; the slots of the runs list and the task page's tables) or ``2026-12-07 13:40:13 UTC``
to the second (a slot in a summary, replicas' heartbeats, windows).
The admin pages (through the template filter ``utc`` of ``scheduling_time``) and the management
commands' text output use it; machine-read values (JSON output, message headers, the webhook)
stay ISO 8601.
"""

from __future__ import annotations

from datetime import UTC, datetime

#: What an instant that is not set shows.
NOT_SET = "-"


def utc_text(moment: datetime | None, precision: str = "ms") -> str:
    """Return ``moment`` (an aware datetime) as UTC text with the zone, or ``NOT_SET``.

    ``precision`` is ``"ms"`` (``2026-12-07 13:40:13.984 UTC``, truncated, not rounded) or
    ``"s"`` (``2026-12-07 13:40:13 UTC``). Raises ValueError for another precision or a naive
    datetime (an instant without a zone cannot be shown in UTC).
    """
    if moment is None:
        return NOT_SET
    if moment.tzinfo is None:
        raise ValueError(f"a naive datetime has no UTC form: {moment!r}")
    utc = moment.astimezone(UTC)
    if precision == "ms":
        return f"{utc:%Y-%m-%d %H:%M:%S}.{utc.microsecond // 1000:03d} UTC"
    if precision == "s":
        return f"{utc:%Y-%m-%d %H:%M:%S} UTC"
    raise ValueError(f"precision is 'ms' or 's', not {precision!r}")
