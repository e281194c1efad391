"""A benchmark scenario that raises costs its own rows, not the run's (``bench.report.Attempts``)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from bench.report import Attempts, Row


def test_a_scenario_that_raises_is_a_failed_row_and_its_logs_are_kept(tmp_path):
    logs = tmp_path / "run"
    (logs / "guard-recorded").mkdir(parents=True)
    (logs / "guard-recorded" / "worker.log").write_text("4905 succeeded\n")
    rows, lines = [Row("idle", "queries", "1.13 q")], []
    attempt = Attempts(rows, lines.append, logs)

    def broken():
        raise RuntimeError("4905/5000 runs executed in the worker's log, 0 twice")

    assert attempt("guard_cost", broken) == ()
    assert attempt("history", lambda: ([Row("history", "claim", "2.5 ms")], {"claim": "plan"}),
                   ([], {})) == ([Row("history", "claim", "2.5 ms")], {"claim": "plan"})
    assert attempt.failed == ["guard_cost"]
    assert rows == [
        Row("idle", "queries", "1.13 q"),
        Row("guard_cost", "the scenario ran to its end",
            "failed: 4905/5000 runs executed in the worker's log, 0 twice", target="ran", met=False),
    ]
    assert lines[0] == "guard_cost ..."
    assert "Traceback" in lines[1] and "RuntimeError: 4905/5000" in lines[1]
    kept = Path(re.fullmatch(r"guard_cost: the processes' logs are kept in (.+)", lines[2])[1])
    try:
        assert (kept / "guard-recorded" / "worker.log").read_text() == "4905 succeeded\n"
    finally:
        shutil.rmtree(kept)
    assert lines[3:] == ["history ..."]
