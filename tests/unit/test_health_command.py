"""``manage.py scheduling_health`` without a database: exit 1 and one line, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_an_unreachable_database_is_one_unhealthy_line():
    env = {**os.environ, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nothing"}
    done = subprocess.run(
        [sys.executable, "manage.py", "scheduling_health"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("unhealthy: cannot read the database: connection failed: ")
    assert "Connection refused" in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.endswith("\n")
