"""Run the benchmark: ``python -m bench`` (full, writes docs/benchmarks.md) or ``--quick``."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from bench import env
from bench.report import Attempts, table

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, about a minute; prints the table, writes no doc")
    parser.add_argument("--output", type=Path, default=None,
                        help="where the run writes its report (default: docs/benchmarks.md for"
                        " a full run of every scenario)")
    parser.add_argument("--only", default="",
                        help="comma-separated scenarios to run (development; writes no doc"
                        " unless --output is given): idle, burst, memory, lateness_and_storm,"
                        " sustained, mvcc_horizon, failover, guard_cost, day_ledger, history,"
                        " million, herd, correctness (day_ledger runs history too: it grows that ledger)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="sample the replicas of burst, sustained, mvcc_horizon and herd, and"
                        " guard_cost's worker pool processes, with py-spy"
                        " and write their profiles to DIR (development: bench/profile.py)")
    args = parser.parse_args(argv)
    command = _command(args.quick, args.only)
    load_before = env.load_average()
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    keep = os.environ.get("BENCH_WORKDIR")  # development: keep the processes' logs there
    folder = nullcontext(keep) if keep else tempfile.TemporaryDirectory(prefix="bench-")
    with env.bench_database(), folder as workdir:
        import logging

        from bench import scale, scenarios
        from bench.guard_cost import guard_cost
        from bench.herd import herd
        from bench.sustained import mvcc_horizon, sustained

        logging.getLogger("scheduling").setLevel(logging.WARNING)  # this process's own planning

        sizes = scenarios.QUICK if args.quick else scenarios.FULL
        bench = scenarios.Bench(sizes, Path(workdir), log, args.profile)
        rows, plans = [], {}
        try:
            only = {name for name in args.only.split(",") if name}

            def wanted(name: str) -> bool:
                return not only or name in only

            attempt = Attempts(rows, log, None if keep else Path(workdir))

            for step in (scenarios.idle, scenarios.burst, scenarios.memory,
                         scenarios.lateness_and_storm, sustained, mvcc_horizon, scenarios.failover,
                         guard_cost, herd, scale.day_ledger, scale.million):
                if wanted(step.__name__):
                    rows += attempt(step.__name__, lambda step=step: step(bench))
            # After day_ledger, whose prune would delete the historical runs; after million,
            # whose replica would claim the runs the history makes due.
            if wanted("history") or wanted("day_ledger"):
                history_rows, plans = attempt("history", lambda: scenarios.history(bench),
                                              ([], {}))
                rows += history_rows
            if wanted("day_ledger"):
                grown_rows, grown_plans = attempt(
                    "day_ledger: the history grown", lambda: scale.history_growth(bench), ([], {})
                )
                rows += grown_rows
                plans.update(grown_plans)
            if wanted("correctness"):  # last: it disables every periodic task
                from bench.correctness import correctness

                rows += attempt("correctness", lambda: correctness(bench))
            setting = {
                "machine": env.machine(),
                "postgres": env.postgres_version(),
                "broker": bench.broker.describe(),
            }
        finally:
            bench.broker.close()
    duration = time.monotonic() - started
    load_after = env.load_average()
    print(table(rows))
    missed = [f"{r.scenario}: {r.measure}" for r in rows if r.met is False]
    print(f"\n{len(rows)} rows, {len(missed)} targets not met; {duration:.0f} s;"
          f" load average before {load_before}, after {load_after}")
    # A partial or profiled run never replaces the full run's doc by default.
    output = args.output or (None if args.quick or args.only or args.profile else DOC)
    if output is not None:
        output.write_text(_document(rows, plans, setting, command, duration,
                                    load_before, load_after))
        print(f"wrote {output}")
    if attempt.failed:
        print(f"scenarios that failed: {', '.join(attempt.failed)}", file=sys.stderr)
    return 1 if attempt.failed else 0


def _command(quick: bool, only: str = "") -> str:
    """The command line, with the environment that chose the database and broker (no secrets)."""
    from urllib.parse import urlsplit

    parts = []
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        value = os.environ.get(name)
        if value:
            url = urlsplit(value)
            if url.password:
                value = value.replace(f":{url.password}@", ":***@", 1)
            parts.append(f"{name}={shlex.quote(value)}")
    options = [*(["--quick"] if quick else []), *([f"--only {only}"] if only else [])]
    return " ".join([*parts, "python -m bench", *options])


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "scheduling", "bench"],
                               cwd=ROOT, text=True, capture_output=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def _document(rows, plans, setting, command, duration, load_before, load_after) -> str:
    machine = setting["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Our scheduler (`scheduling.schedulers.LedgerScheduler`), stock django-celery-beat",
        "`DatabaseScheduler` and raw kombu publishing of the same messages, in one run, on the",
        "same PostgreSQL and broker; for correctness, RedBeat, the seed's Redlock-per-container",
        "baseline and django-periodic-tasks too. What each scenario does and how to read it:",
        "[benchmarking.md](benchmarking.md); the code is `bench/`.",
        "",
        "## Command",
        "",
        "```sh",
        command,
        "```",
        "",
        f"At commit {_commit()}; it took {duration / 60:.1f} minutes.",
        "",
        "## Machine",
        "",
        f"- CPU: {machine['cpu']}, {machine['cores']} cores; RAM {machine['ram']}",
        f"- {machine['os']}, Python {machine['python']}",
        f"- {setting['postgres']}; broker: {setting['broker']}",
        f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}",
        "",
        "## Results",
        "",
        table(rows),
        "",
        "## Targets not met",
        "",
        *([f"- {r.scenario}: {r.measure}: {r.ours} (target {r.target})" for r in rows
           if r.met is False] or ["None."]),
        "",
        "## Query plans with the historical runs in the ledger",
        "",
        "`EXPLAIN (ANALYZE, BUFFERS)` of the claim query (100 runs due) and of the poll query",
        "(one per idle tick), as the scheduler sends them.",
        "",
    ]
    for name, plan in plans.items():
        lines += [f"### {name}", "", "```", plan, "```", ""]
    lines += _kept_sections()
    return "\n".join(lines)


#: Sections of docs/benchmarks.md written by hand (figures of partial runs, before and after a
#: change) that a full run carries over to the document it writes.
KEPT = ("## Herd",)


def _kept_sections() -> list[str]:
    """The lines of each ``KEPT`` section of the current doc (to the next ``## `` heading)."""
    if not DOC.exists():
        return []
    kept, keeping = [], False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            keeping = line.strip() in KEPT
        if keeping:
            kept.append(line)
    return kept


if __name__ == "__main__":
    sys.exit(main())
