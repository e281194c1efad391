"""The benchmark's CPU meters (``bench.env.cpu_seconds``, ``postgres_cpu_seconds``), read from
``/proc`` against this process and the test database's own server."""

from __future__ import annotations

import os
import time

import pytest
from django.db import connection

from bench.env import cpu_seconds, postgres_cpu_seconds

pytestmark = pytest.mark.django_db


def test_a_process_cpu_time_is_what_the_process_itself_counts():
    before, counted = cpu_seconds(os.getpid()), time.process_time()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    used, meter = time.process_time() - counted, cpu_seconds(os.getpid()) - before
    assert used >= 0.3
    assert abs(meter - used) <= 0.05  # /proc counts in clock ticks (10 ms)


def test_the_server_cpu_time_includes_the_backend_that_did_the_work():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
        server, own = postgres_cpu_seconds(), cpu_seconds(backend)
        cursor.execute("SELECT count(*) FROM generate_series(1, 3000000) AS n WHERE n % 7 = 0")
        assert cursor.fetchone()[0] == 3000000 // 7
        worked = cpu_seconds(backend) - own
        grew = postgres_cpu_seconds() - server
    assert worked >= 0.1  # counting three million numbers takes a backend that long
    assert grew >= worked - 0.02
