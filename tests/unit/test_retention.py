"""Durations of the prune settings and command."""

from __future__ import annotations

from datetime import timedelta

import pytest

from scheduling.retention import parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45), ("2w", 1209600),
     ("1.5h", 5400), (60, 60), (timedelta(minutes=2), 120)],
)
def test_parse_duration(value, seconds):
    assert parse_duration(value) == timedelta(seconds=seconds)


@pytest.mark.parametrize("value", ["30", "d", "30 days", "-1d", -5, "1y"])
def test_parse_duration_rejects(value):
    with pytest.raises(ValueError):
        parse_duration(value)
