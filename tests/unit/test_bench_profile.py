"""The benchmark's profile summary (``bench.profile``): py-spy's collapsed stacks summed by function."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.profile import per_execution, profiled, summary

PACKAGES = "/srv/.venv/lib/python3.11/site-packages"


def test_a_function_counts_once_per_stack_inclusive_and_on_top_as_self(tmp_path):
    stacks = tmp_path / "replica-1.txt"
    stacks.write_text(
        f"tick (scheduling/schedulers.py:10);claim (scheduling/ledger/claim.py:5);"
        f"execute ({PACKAGES}/psycopg/cursor.py:7) 6\n"
        # A recursion: claim twice on one stack still counts its samples once.
        "tick (scheduling/schedulers.py:11);claim (scheduling/ledger/claim.py:5);"
        "claim (scheduling/ledger/claim.py:9) 2\n"
        f"tick (scheduling/schedulers.py:12);send_task ({PACKAGES}/celery/app/base.py:700) 2\n"
    )
    text = summary("burst", [stacks])
    assert "10 samples at 100 Hz from 1 processes (CPU only)." in text
    inclusive = text.split("Most samples on top")[0]
    assert "| `tick (scheduling/schedulers.py)` | 100.0 % | 0.0 % |" in inclusive
    assert "| `claim (scheduling/ledger/claim.py)` | 80.0 % | 20.0 % |" in inclusive
    assert "| `execute (psycopg/cursor.py)` | 60.0 % | 60.0 % |" in inclusive
    assert "| `send_task (celery/app/base.py)` | 20.0 % | 20.0 % |" in inclusive


def test_per_execution_puts_each_stack_in_its_first_part_and_counts_milliseconds(tmp_path):
    pool = tmp_path / "pool-1.txt"
    pool.write_text(
        "trace_task (celery/app/trace.py:1);guard (scheduling/guard.py:2);"
        "_Liveness.start (scheduling/guard.py:3) 30\n"
        "trace_task (celery/app/trace.py:1);_Liveness.finish (scheduling/guard.py:4) 20\n"
        "trace_task (celery/app/trace.py:1);noop (project/tasks.py:1) 4\n"
        "workloop (billiard/pool.py:1);_recv (billiard/connection.py:2) 40\n"
        "main (x.py:1) 6\n"
    )
    parts = [("start", ("_Liveness.start",)), ("outcome", ("_Liveness.finish",)),
             ("unused", ("record_started",)), ("trace", ("trace_task",)), ("waiting", ("_recv",))]
    shares = per_execution([pool], 10, parts)  # 100 samples at 100 Hz: 1 s over 10 executions
    assert [(name, round(ms, 6)) for name, ms in shares] == [
        ("start", 30.0), ("outcome", 20.0), ("trace", 4.0), ("waiting", 40.0), ("other", 6.0)
    ]


@pytest.mark.skipif(
    shutil.which("py-spy") is None and not Path(sys.executable).with_name("py-spy").exists(),
    reason="py-spy is not installed",
)
def test_a_spinning_process_is_sampled_in_its_own_function(tmp_path):
    code = ("def spin():\n    print('spinning', flush=True)\n    while True:\n"
            "        sum(range(1000))\nspin()\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"spinning\n"  # past its start-up, in spin()
        with profiled(tmp_path, "spin", [process.pid]):
            time.sleep(3.0)
    finally:
        process.kill()
        process.wait()
    assert (tmp_path / f"spin-{process.pid}.txt").exists()
    table = (tmp_path / "spin.md").read_text().split("Most samples on top")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    # Every CPU sample of the process is inside spin(), called from the module.
    assert rows[0].startswith("| `<module> (<string>)` | 100.0 % |")
    assert rows[1].startswith("| `spin (<string>)` | 100.0 % |")
