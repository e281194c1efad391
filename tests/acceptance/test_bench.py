"""The benchmark's quick mode runs end to end and prints a complete, well-formed table.

Not a timed test: the figures depend on the machine. It checks that every scenario's rows are
there, each figure is a number with its unit, and each target row says met or NOT MET.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.acceptance.deployment import ROOT

pytestmark = [pytest.mark.acceptance, pytest.mark.once, pytest.mark.timeout(1500)]

#: (scenario prefix, measure prefix) of every row the quick run must print, in order.
EXPECTED_ROWS = [
    ("idle tick, 100 tasks", "queries / DB time per tick"),
    ("idle tick, 1,000 tasks", "queries / DB time per tick"),
    ("idle tick, 3,000 tasks", "queries / DB time per tick"),
    ("idle tick, 3,000 vs 100 tasks", "DB time per tick ratio"),
    ("burst 200 tasks", "all dispatched, 1 replica"),
    ("burst 200 tasks", "all dispatched, 2 replicas"),
    ("burst 200 tasks", "all dispatched, 4 replicas"),
    ("burst 200 tasks", "3 replicas vs raw kombu publish"),
    ("burst 200 tasks", "3 replicas vs 1 stock DatabaseScheduler"),
    ("burst 200 tasks", "CPU per 1,000 runs: 3 replicas (+ PostgreSQL) vs raw kombu"),
    ("memory, 3,000 tasks", "RSS of one replica (peak)"),
    ("lateness, 50 tasks/s, 3 replicas, 4 s", "lateness p99 (ledger"),
    ("lateness, 50 tasks/s, 3 replicas, 4 s", "lateness max (ledger)"),
    ("lateness, 50 tasks/s, 3 replicas, 4 s", "lateness p99 / max at the broker"),
    ("edit storm, 300 crontab tasks", "lateness p99 (ledger"),
    ("edit storm, 300 crontab tasks", "full reloads (full reconcile passes) during the storm"),
    ("lateness, 50 tasks/s, 3 replicas, 4 s, one CPU hog beside", "lateness p99 (ledger"),
    ("lateness, 50 tasks/s, 3 replicas, 4 s, one CPU hog beside",
     "lateness p99 / max at the broker"),
    ("edit storm, 300 crontab tasks", "lateness p99 (ledger"),
    ("edit storm, 300 crontab tasks", "full reloads (full reconcile passes) during the storm"),
    ("sustained, 100 runs/s, 2 replicas, 8 s", "lateness p99 (ledger"),
    ("sustained, 100 runs/s, 2 replicas, 8 s", "lateness max (ledger)"),
    ("sustained, 100 runs/s, 2 replicas, 8 s", "lateness p99 / max at the broker"),
    ("sustained, 100 runs/s, 2 replicas, 8 s", "slots dispatched as a run each (ledger)"),
    ("sustained, 100 runs/s, 2 replicas, 8 s", "CPU per 1,000 runs: 2 replicas (+ PostgreSQL)"),
    ("sustained, 100 runs/s, 2 replicas, 8 s", "the machine's limit: cores busy over the window"),
    ("MVCC horizon held 10 s, 50 runs/s, 2 replicas", "lateness p99 (ledger"),
    ("MVCC horizon held 10 s, 50 runs/s, 2 replicas", "lateness max (ledger)"),
    ("MVCC horizon held 10 s, 50 runs/s, 2 replicas", "lateness p99 / max at the broker"),
    ("MVCC horizon held 10 s, 50 runs/s, 2 replicas", "slots dispatched as a run each (ledger)"),
    ("MVCC horizon held 10 s, 50 runs/s, 2 replicas", "claim server time per due run at the start"),
    ("MVCC horizon held 10 s, 50 runs/s, 2 replicas", "claim time at the start / end (prepared"),
    ("MVCC horizon held 10 s, 50 runs/s, 2 replicas", "dead tuples of scheduling_run"),
    ("failover, 2 trials", "kill to re-dispatch by another replica, median"),
    ("failover, 2 trials", "kill to re-dispatch by another replica, max"),
    ("worker, no-op task, 200 runs, concurrency 2", "executions per second: guarded / guard left"),
    ("worker, no-op task, 200 runs, concurrency 2", "executions per second: guarded vs plain"),
    ("worker, no-op task, 200 runs, concurrency 2",
     "executions per second: guarded with asynchronous commit"),
    ("worker, no-op task, 200 runs, concurrency 2", "the server's commit ceiling"),
    ("herd, 100 clocked one-offs, 3 replicas, 2 guarded workers", "every run once: dispatched"),
    ("herd, 100 clocked one-offs, 3 replicas, 2 guarded workers", "lateness median / p99 / max at the ledger"),
    ("herd, 100 clocked one-offs, 3 replicas, 2 guarded workers", "lateness median / p99 / max at the broker"),
    ("herd, 100 crontab tasks, one minute, 3 replicas, 2 guarded workers", "every run once: dispatched"),
    ("herd, 100 crontab tasks, one minute, 3 replicas, 2 guarded workers",
     "lateness median / p99 / max at the ledger"),
    ("herd, 100 crontab tasks, one minute, 3 replicas, 2 guarded workers",
     "lateness median / p99 / max at the broker"),
    ("day's ledger, 50 runs/s, 2 replicas, 4 s windows, prune older than 1 s",
     "ledger size, prune on: window start -> end"),
    ("day's ledger, 50 runs/s, 2 replicas, 4 s windows, prune older than 1 s",
     "ledger size, prune off: window start -> end"),
    ("day's ledger, 50 runs/s, 2 replicas, 4 s windows, prune older than 1 s",
     "prune on vs off: lateness p99 (ledger)"),
    ("20,000 periodic tasks", "bulk create / plan (this process)"),
    ("idle tick, 20,000 tasks", "queries / DB time per tick"),
    ("idle tick, 20,000 vs 1,000 tasks", "DB time per tick ratio"),
    ("20,000 periodic tasks", "start-up: process start to its first full reconcile done"),
    ("20,000 periodic tasks", "RSS of one replica, settled (peak)"),
    ("20,000 periodic tasks", "one edit re-planned in the ledger, median / max of 3"),
    ("ledger with 50,000 finished runs", "claim query, prepared as the scheduler sends it,"),
    ("ledger with 50,000 finished runs", "poll query (median of 20)"),
    ("ledger with 250,000 finished runs", "claim query, prepared as the scheduler sends it,"),
    ("ledger with 250,000 finished runs", "poll query (median of 20)"),
    ("ledger, 250,000 vs 50,000 finished runs", "time ratio, claim query"),
    ("ledger, 250,000 vs 50,000 finished runs", "time ratio, poll query"),
    ("correctness: SIGSTOP 9 s of the busiest scheduler", "duplicate executions (worker's log)"),
    ("correctness: SIGSTOP 9 s of the busiest scheduler", "lost runs (worker's log)"),
    ("correctness: SIGKILL of the busiest scheduler", "duplicate executions (worker's log)"),
    ("correctness: SIGKILL of the busiest scheduler", "lost runs (worker's log)"),
]
#: The peers' columns, after ours.
PEERS = ["stock", "redbeat (lock 1,500 s)", "redbeat (tuned lock)", "redlock per container",
         "django-periodic-tasks"]
NUMBER = r"\d[\d,]*(\.\d+)?"
#: What the "ours" cell of each kind of row looks like.
OURS = {
    "queries / DB time per tick": rf"^{NUMBER} q, {NUMBER} ms \(poll {NUMBER} q {NUMBER} ms;"
    rf" reconcile {NUMBER} q {NUMBER} ms\)$",
    "DB time per tick ratio": rf"^{NUMBER} ms / {NUMBER} ms$",
    "all dispatched": rf"^{NUMBER} s \({NUMBER}/s\)$",
    "3 replicas": rf"^{NUMBER} s \({NUMBER}/s\)$",
    # PostgreSQL's share only when the server is a process of this host.
    "CPU per 1,000 runs": rf"^{NUMBER} CPU s( \+ PostgreSQL {NUMBER} CPU s)?$",
    "RSS": rf"^{NUMBER} MB \(peak {NUMBER} MB\)$",
    "the machine's limit": rf"^{NUMBER} of \d+ \(replicas {NUMBER}(, PostgreSQL {NUMBER})?\)$",
    "lateness p99 (ledger": rf"^{NUMBER} ms$",
    "lateness max": rf"^{NUMBER} ms$",
    "lateness p99 / max at the broker": rf"^({NUMBER} ms / {NUMBER} ms; \d+ missing, \d+ extra"
    r" copies|n/a for this broker)$",
    "full reloads": r"^\d+$",
    "kill to re-dispatch": rf"^{NUMBER} s$",
    # plain and guarded: the median of three interleaved rounds, then each round's rate
    "executions per second: guarded /": rf"^{NUMBER} runs/s \(median of {NUMBER}, {NUMBER},"
    rf" {NUMBER}\) / {NUMBER} runs/s$",
    "executions per second: guarded vs": rf"^{NUMBER} runs/s \(median of {NUMBER}, {NUMBER},"
    rf" {NUMBER}\)$",
    "executions per second: guarded with": rf"^{NUMBER} runs/s$",
    "the server's commit ceiling": rf"^{NUMBER} / {NUMBER} commits/s$",
    "claim query": rf"^{NUMBER} ms$",
    "ledger size": rf"^{NUMBER} -> {NUMBER} rows \([+-]{NUMBER}%\); {NUMBER} -> {NUMBER} MB"
    rf" \([+-]{NUMBER}%\); prune deleted {NUMBER} runs; \d+ vacuums \((the server's autovacuum|"
    r"autovacuum off on the server: its rule run by the benchmark every [\d.]+ s)\)$",
    "prune on vs off": rf"^{NUMBER} ms / {NUMBER} ms \({NUMBER} / {NUMBER} runs\)$",
    "bulk create / plan": rf"^{NUMBER} s / {NUMBER} s$",
    "start-up": rf"^{NUMBER} s \(beat ready {NUMBER} s, pass {NUMBER} s\)$",
    "one edit re-planned": rf"^{NUMBER} ms / {NUMBER} ms \(the save itself: median {NUMBER} ms,"
    rf" max {NUMBER} ms\)$",
    "time ratio": rf"^{NUMBER} ms / {NUMBER} ms$",
    "poll query": rf"^{NUMBER} ms$",
    "claim server time per due run": rf"^{NUMBER} / {NUMBER} us \({NUMBER} / {NUMBER} buffers per"
    rf" due run; {NUMBER} / {NUMBER} due\)$",
    "claim time at the start": rf"^{NUMBER} ms / {NUMBER} ms$",
    "dead tuples": rf"^{NUMBER}$",
    "slots dispatched": rf"^{NUMBER} of {NUMBER} \({NUMBER} runs/s\); {NUMBER} coalesced or not"
    " dispatched$",
    "every run once: dispatched": rf"^{NUMBER} / ({NUMBER} arrived, \d+ extra copies|n/a for this"
    rf" broker) / {NUMBER} executed, \d+ twice$",
    "lateness median / p99 / max at the": rf"^({NUMBER} / {NUMBER} / {NUMBER} s|n/a for this"
    r" broker)$",
    # Acceptance 1 of issue 17: ours loses no run and executes none twice under either fault.
    "duplicate executions": r"^0$",
    "lost runs": r"^0$",
}


def test_quick_mode_prints_every_scenario_with_well_formed_figures():
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True,
        timeout=1400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    header, *rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
    assert header == ["scenario", "measure", "ours", *PEERS, "raw publish", "ratio", "target",
                      "met"]
    assert len(rows) == len(EXPECTED_ROWS), result.stdout
    for row, (scenario, measure) in zip(rows, EXPECTED_ROWS):
        assert row[0].startswith(scenario) and row[1].startswith(measure), row
        pattern = next(p for key, p in OURS.items() if row[1].startswith(key))
        assert re.match(pattern, row[2]), row
        assert row[11] in ({"met", "NOT MET"} if row[10] != "-" else {"-"}), row
        if row[9] != "-":
            assert re.search(NUMBER + "x", row[9]), row
    plain = next(row for row in rows if row[1].startswith("executions per second: guarded vs"))
    assert re.match(
        rf"^send_task, no ledger {NUMBER} runs/s \(median of {NUMBER}, {NUMBER}, {NUMBER}\)$",
        plain[8],
    ), plain
    burst_vs = {row[1]: row for row in rows if row[0].startswith("burst")}
    assert re.match(
        rf"^kombu {NUMBER} s \({NUMBER}/s\); Celery send_task, no ledger {NUMBER} s \({NUMBER}/s\)$",
        burst_vs["3 replicas vs raw kombu publish"][8],
    )
    assert re.match(rf"^(>= )?{NUMBER} s", burst_vs["3 replicas vs 1 stock DatabaseScheduler"][3])
    cpu = burst_vs["CPU per 1,000 runs: 3 replicas (+ PostgreSQL) vs raw kombu"]
    assert re.match(rf"^{NUMBER} CPU s \(its beat\)$", cpu[3]), cpu
    assert re.match(rf"^kombu {NUMBER} CPU s; Celery send_task, no ledger {NUMBER} CPU s$", cpu[8]), cpu
    for row in rows[-4:]:  # correctness: every peer counted (RedBeat and Redlock need Redis)
        assert row[10] == "0" and row[11] == "met", row
        assert re.match(rf"^{NUMBER}$", row[3]), row
        assert re.match(rf"^{NUMBER}$", row[7]), row  # django-periodic-tasks: no Redis needed
        for cell in row[4:7]:
            assert re.match(rf"^({NUMBER}|n/a \(no Redis\))$", cell), row
    for row in rows:  # the herd: every run once (issue 35, point 2)
        if row[0].startswith("herd") and row[1].startswith("every run once"):
            assert row[header.index("met")] == "met", row
    memory = next(row for row in rows if row[0].startswith("memory"))
    assert re.match(rf"^{NUMBER} MB \(peak {NUMBER} MB\)$", memory[3])
    assert re.search(r"^\d+ rows, \d+ targets not met; \d+ s; load average before ", result.stdout,
                     re.MULTILINE)
    assert "wrote" not in result.stdout  # quick mode writes no document
