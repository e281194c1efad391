"""The replica's retry backoff during an outage: doubling, capped, jittered in its upper half."""

from __future__ import annotations

import random

import pytest

from scheduling.backoff import retry_delay

CAP = 3.0


@pytest.mark.parametrize(
    ("failures", "low", "high"),
    [(1, 0.25, 0.5), (2, 0.5, 1.0), (3, 1.0, 2.0), (4, 1.5, 3.0), (5, 1.5, 3.0), (60, 1.5, 3.0)],
)
def test_retry_delay_bounds_double_from_half_a_second_up_to_the_cap(failures, low, high):
    assert retry_delay(failures, CAP, draw=lambda: 0.0) == low
    assert retry_delay(failures, CAP, draw=lambda: 0.999999) == pytest.approx(high, abs=1e-5)


def test_retry_delay_is_jittered_within_the_bounds():
    rng = random.Random(7)
    delays = [retry_delay(6, CAP, draw=rng.random) for _ in range(1000)]
    assert min(delays) >= 1.5 and max(delays) < 3.0
    # spread over the whole upper half, so replicas that failed together do not retry in step
    buckets = [int((d - 1.5) / 0.15) for d in delays]
    assert all(buckets.count(b) >= 50 for b in range(10))


def test_a_whole_outage_never_waits_longer_than_the_cap_between_attempts():
    waits = [retry_delay(n, CAP) for n in range(1, 200)]
    assert max(waits) < CAP
    assert sum(waits[:4]) < 0.5 + 1.0 + 2.0 + 3.0
