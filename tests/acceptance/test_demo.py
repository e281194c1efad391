"""The README's first command, ``./run demo``, as a user runs it (``manage.py demo``, which
``./run demo`` calls): three replicas, a worker and the admin start, one replica is SIGKILLed,
the others carry on, and the demo stops by itself with every run executed once.

On the test database and the session's broker (embedded PostgreSQL and kombu's SQL transport in
``.ci/run``'s first pass), a queue and a data folder of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest
from django.conf import settings

from tests.acceptance.deployment import ROOT
from tests.acceptance.deployment import test_database_url as database_url
from tests.acceptance.private_redis import free_port

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]


def test_the_demo_starts_survives_a_killed_replica_and_stops_by_itself(tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CELERY_TASK_DEFAULT_QUEUE": f"q-demo-{uuid.uuid4().hex[:8]}",
        "SCHEDULING_DATA_DIR": str(tmp_path),
    }
    port = free_port("127.0.0.1")
    done = subprocess.run(
        [sys.executable, "manage.py", "demo", "--duration", "25", "--kill-replica",
         "--port", str(port)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:] + out[-3000:]
    started = re.findall(r"(\S+) \(pid \d+\)", re.search(r"^started (.*)$", out, re.M).group(1))
    assert sorted(started) == ["admin", "replica-1", "replica-2", "replica-3", "worker"]
    assert f"admin: http://127.0.0.1:{port}/admin/" in out
    assert "Ctrl-C stops the demo (and --duration SECONDS stops it by itself)" in out
    killed = re.search(r"killed (replica-\d) \(pid \d+\) with SIGKILL", out).group(1)
    stopped = re.search(r"^stopped (.*)$", out, re.M).group(1).split(", ")
    assert sorted(stopped) == sorted(set(started) - {killed})
    assert re.search(r"^final: ", out, re.M)
    logs = list((tmp_path / "demo-logs").iterdir())
    assert len(logs) == 1 and (logs[0] / "worker.log").is_file()
