"""``{% load scheduling_time %}``: ``{{ run.scheduled_for|utc }}`` (to the millisecond) and
``{{ replica.started_at|utc:"s" }}`` (to the second), as ``scheduling.timeformat.utc_text``."""

from __future__ import annotations

from datetime import datetime

from django import template

from scheduling.timeformat import utc_text

register = template.Library()


@register.filter
def utc(moment: datetime | None, precision: str = "ms") -> str:
    """An instant as UTC text with the zone: ``2026-12-07 13:40:13.984 UTC``."""
    return utc_text(moment, precision)
