"""The history checker: a chaos run's events, verified slot by slot and run by run.

    python -m tools.history HISTORY.jsonl      # prints the summary; exit 1 on a breach

A history is JSON lines, one event each (``tools.capture`` writes the ledger's, ``tools.chaos``
adds the workers' executions and its SIGKILLs), with ``kind``, ``at`` (ISO 8601, the database
clock), ``process`` and, for run events, ``run`` (the ledger row's id), ``task_id``, ``task``
(the periodic task's name), ``slot`` (``scheduled_for``) and ``trigger``. Kinds:

- planned, claimed, published, committed (the dispatch committed by a replica), adopted (a worker
  started a run still pending: published by a replica whose claim did not commit; the worker's
  transaction is its dispatch), started, suppressed (the guard dropped a copy), finished (the
  body's outcome), re-published (delivery deadline or worker-loss recovery), closed (with
  ``status`` and ``reason``: not delivered, worker lost, a misfire, cancelled...);
- executed: one body that ran to its end, from the worker's own execution log (``task_id``,
  ``pgid``: the worker's process group);
- killed: a worker SIGKILLed by the chaos tool (``process``, ``pgid``; ``at`` once it is dead);
- window: the end of the chaos run's window (``until``, ISO 8601): runs of later slots were still
  being dispatched when the tool stopped its processes, so they are not held to the delivery
  rule below (counted as ``runs after the window``).

Rules (``BREACHES``), per slot (a scheduled run's periodic task and ``scheduled_for``; any other
run is a slot of its own) and per run:

- claimed at most once, and committed (or adopted) at most once: a re-publish of the same run is
  neither;
- executed at most once: two ``executed`` events of one task id are a breach unless every one
  but one came from a worker process group SIGKILLed after it (its outcome was lost with it and
  the message redelivered: the guard's rule for a worker lost mid-body);
- every committed (or adopted) run of a slot up to the window's end executed, or closed with a
  reason, or finished;
- no execution of a run never committed: an ``executed`` event before any commit or adoption of
  its task id, or of a task id no run has;
- no run closed without a reason.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

KINDS = (
    "planned",
    "claimed",
    "published",
    "committed",
    "adopted",
    "started",
    "suppressed",
    "executed",
    "finished",
    "re-published",
    "closed",
    "killed",
    "window",
)
BREACHES = (
    "slot claimed twice",
    "slot committed twice",
    "run executed twice",
    "committed, never executed nor closed",
    "executed, never committed",
    "closed without a reason",
)
#: Runs named per breach kind in the summary.
NAMED = 10


@dataclass
class Verdict:
    """What ``check`` found: events by kind, slots and runs seen, and per breach kind the runs
    (``run <id> (<task> @ <slot>, task id <id>)``) that broke it."""

    events: Counter[str] = field(default_factory=Counter)
    slots: int = 0
    runs: int = 0
    after_window: int = 0
    breaches: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in BREACHES})

    @property
    def ok(self) -> bool:
        return not any(self.breaches.values())

    def count(self, kind: str) -> int:
        return len(self.breaches[kind])

    def summary(self) -> str:
        """Events by kind, slots, runs, breaches by kind with the runs named, the verdict."""
        rows = [("history events", sum(self.events.values()))]
        rows += [(f"  {kind}", self.events[kind]) for kind in KINDS]
        rows += [
            (f"  {kind} (unknown kind)", n)
            for kind, n in sorted(self.events.items())
            if kind not in KINDS
        ]
        rows += [("slots", self.slots), ("runs", self.runs)]
        rows += [("runs after the window", self.after_window)]
        rows += [("history breaches", sum(len(v) for v in self.breaches.values()))]
        rows += [(f"  {kind}", len(self.breaches[kind])) for kind in BREACHES]
        width = max(len(k) for k, _ in rows) + 2
        lines = [f"{k:<{width}}{v:>8}" for k, v in rows]
        for kind in BREACHES:
            named = self.breaches[kind]
            lines += [f"{kind}: {name}" for name in named[:NAMED]]
            if len(named) > NAMED:
                lines.append(f"{kind}: and {len(named) - NAMED} more")
        lines.append("history: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(lines)


def instant(moment: datetime) -> str:
    """``moment`` (aware) as a history's ``at``: ISO 8601 in UTC, with microseconds, so that
    instants compare as strings."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def read(path: Path | str) -> list[dict[str, Any]]:
    """The events of a history file (JSON lines); a line cut short is skipped."""
    events = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def _slot(event: dict[str, Any]) -> tuple[Any, ...]:
    if event.get("trigger", "schedule") == "schedule":
        return ("slot", event.get("task"), event.get("slot"))
    return ("run", event.get("run"))


@dataclass
class _Run:
    """One ledger run's events, by kind."""

    name: str
    slot: tuple[Any, ...]
    task_id: str
    scheduled_for: str
    kinds: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))


def check(events: Iterable[dict[str, Any]]) -> Verdict:
    """Verify a history (see the module docstring); return the verdict."""
    verdict = Verdict()
    runs: dict[Any, _Run] = {}
    executed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    kills: list[dict[str, Any]] = []
    until = ""
    for event in sorted(events, key=lambda e: e.get("at") or ""):
        kind = event.get("kind", "")
        verdict.events[kind] += 1
        if kind == "executed":
            executed[str(event.get("task_id"))].append(event)
        elif kind == "killed":
            kills.append(event)
        elif kind == "window":
            until = max(until, str(event.get("until") or ""))
        elif event.get("run") is not None:
            run = runs.get(event["run"])
            if run is None:
                run = runs[event["run"]] = _Run(
                    _name(event), _slot(event), str(event["task_id"]), str(event.get("slot"))
                )
            run.kinds[kind].append(event)
    verdict.runs = len(runs)
    by_slot: dict[tuple[Any, ...], list[_Run]] = defaultdict(list)
    by_task_id: dict[str, list[_Run]] = defaultdict(list)
    for run in runs.values():
        by_slot[run.slot].append(run)
        by_task_id[run.task_id].append(run)
    verdict.slots = len(by_slot)
    for slot_runs in by_slot.values():
        _check_slot(slot_runs, verdict)
    for run in runs.values():
        late = bool(until) and run.scheduled_for > until
        verdict.after_window += late
        _check_run(run, executed, verdict, delivery=not late)
    for task_id, bodies in executed.items():
        _check_executions(task_id, bodies, by_task_id.get(task_id, []), kills, verdict)
    return verdict


def _check_slot(runs: list[_Run], verdict: Verdict) -> None:
    claims = [run for run in runs for _ in run.kinds["claimed"]]
    if len(claims) > 1:
        verdict.breaches["slot claimed twice"].append(_names(claims, "claimed"))
    commits = [run for run in runs for _ in run.kinds["committed"] + run.kinds["adopted"]]
    if len(commits) > 1:
        verdict.breaches["slot committed twice"].append(_names(commits, "committed"))


def _check_run(
    run: _Run, executed: dict[str, list[dict[str, Any]]], verdict: Verdict, *, delivery: bool
) -> None:
    for closed in run.kinds["closed"]:
        if not closed.get("reason"):
            verdict.breaches["closed without a reason"].append(
                f"{run.name}: {closed.get('status')} at {closed.get('at')}"
            )
    commits = run.kinds["committed"] + run.kinds["adopted"]
    if (
        delivery
        and commits
        and not (
            executed.get(run.task_id)
            or run.kinds["finished"]
            or any(c.get("reason") for c in run.kinds["closed"])
        )
    ):
        last = run.kinds["re-published"][-1:] or commits
        verdict.breaches["committed, never executed nor closed"].append(
            f"{run.name}: committed at {commits[0].get('at')} by {commits[0].get('process')}, "
            f"re-published {len(run.kinds['re-published'])}x, last {last[0].get('at')}"
        )


def _check_executions(
    task_id: str,
    bodies: list[dict[str, Any]],
    runs: list[_Run],
    kills: list[dict[str, Any]],
    verdict: Verdict,
) -> None:
    commits = sorted(
        e.get("at") or "" for run in runs for e in run.kinds["committed"] + run.kinds["adopted"]
    )
    name = runs[0].name if runs else f"task id {task_id} (no run has it)"
    for body in bodies:
        if not commits or (body.get("at") and body["at"] < commits[0]):
            verdict.breaches["executed, never committed"].append(
                f"{name}: executed at {body.get('at')} by process group {body.get('pgid')}"
                + (f", committed first at {commits[0]}" if commits else ", never committed")
            )
    survived = [body for body in bodies if not _killed_after(body, kills)]
    if len(survived) > 1:
        groups = ", ".join(str(body.get("pgid")) for body in bodies)
        verdict.breaches["run executed twice"].append(
            f"{name}: executed {len(bodies)}x (process groups {groups}), "
            f"{len(survived)} by workers not SIGKILLed after"
        )


def _killed_after(body: dict[str, Any], kills: list[dict[str, Any]]) -> bool:
    """Whether the worker process group that ran ``body`` was SIGKILLed after (or at) it."""
    return any(
        kill.get("pgid") == body.get("pgid") and (kill.get("at") or "") >= (body.get("at") or "")
        for kill in kills
    )


def _name(event: dict[str, Any]) -> str:
    return (
        f"run {event.get('run')} ({event.get('task')} @ {event.get('slot')}, "
        f"task id {event.get('task_id')})"
    )


def _names(runs: list[_Run], kind: str) -> str:
    counts = Counter(run.name for run in runs)
    return "; ".join(f"{name} {kind} {n}x" for name, n in counts.items())


def main(argv: list[str] | None = None) -> int:
    """Check the history file named on the command line; print the summary; 1 on a breach."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m tools.history HISTORY.jsonl", file=sys.stderr)
        return 2
    verdict = check(read(args[0]))
    print(verdict.summary())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
