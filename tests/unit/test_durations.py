"""Durations of the prune settings and command, and timedeltas as seconds."""

from __future__ import annotations

from datetime import timedelta

import pytest

from scheduling.durations import parse_duration, seconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45), ("2w", 1209600),
     ("1.5h", 5400), (60, 60), (timedelta(minutes=2), 120)],
)
def test_parse_duration(value, expected):
    assert parse_duration(value) == timedelta(seconds=expected)


@pytest.mark.parametrize("value", ["30", "d", "30 days", "-1d", -5, "1y"])
def test_parse_duration_rejects(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_seconds():
    assert (seconds(timedelta(milliseconds=1500)), seconds(None)) == (1.5, None)
