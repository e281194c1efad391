"""Duplicate executions and lost runs of interval tasks, from a worker's execution log.

Pure functions over the lines ``project.tasks.record`` writes (``tools.processes.read_executions``):
no database, no processes. Two ways to tell which run an execution belongs to:

- ``by_slot``: our scheduler's messages carry the run's nominal slot (the ``scheduled_for``
  header), so each execution is matched to the slot it stands for, and the expected slots come
  from the schedule (``scheduling.slots.slots_between``);
- ``by_time``: the peers' messages carry no slot, and stock beat's next send is its last send
  plus the interval (no anchored slots), so executions are grouped by time: one closer than half
  an interval to the first execution of the current group is a duplicate of it (a copy of the
  same run); a gap of n intervals (rounded) between two runs is n - 1 lost runs; so is every
  whole interval of silence before the first run and after the last one. A sender that is only
  late (celery's interval schedule: next send = last send + interval, so each send's lateness
  adds up) loses no run by this count; it sends fewer runs than the window has slots. Where
  senders drift apart by more than half an interval, their copies of a run look like runs of
  their own: the duplicates are then at least the executions beyond the window's slots. Both
  counts are lower bounds, and a run late by about half an interval may count as one lost slot
  and the next slot's run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Counts:
    """What happened to one set of runs: ``slots`` expected, ``executions`` seen."""

    slots: int
    executions: int
    duplicates: int
    lost: int

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.slots + other.slots, self.executions + other.executions,
                      self.duplicates + other.duplicates, self.lost + other.lost)


NONE = Counts(0, 0, 0, 0)


def by_time(
    times: Iterable[float], every: float, start: float, end: float, horizon: float | None = None
) -> Counts:
    """Count the runs of one task in the window ``[start, end)`` (epoch seconds) by time.

    ``times``: every execution of the task (the whole log, so that a run whose copies straddle
    the window's edge is one run); ``every``: its interval in seconds; ``horizon``: when its
    senders were stopped (default ``end``), so that silence after the last run up to then is
    lost. A run belongs to the window where its first execution is; a lost run, where it was due.
    ``slots`` is the number of whole intervals in the window.
    """
    groups: list[list[float]] = []  # [first execution, copies]
    for at in sorted(times):
        if groups and at - groups[-1][0] < every / 2:
            groups[-1][1] += 1
        else:
            groups.append([at, 1])
    slots = math.floor((end - start) / every)
    if not groups:
        return Counts(slots, 0, 0, slots)
    executions = duplicates = 0
    missing: list[float] = [  # silence from the window's start to the first run
        groups[0][0] - k * every for k in range(1, math.floor((groups[0][0] - start) / every) + 1)
    ]
    for i, (first, copies) in enumerate(groups):
        if start <= first < end:
            executions += int(copies)
            duplicates += int(copies) - 1
        if i + 1 < len(groups):
            gap = groups[i + 1][0] - first
            runs = max(1, round(gap / every))
            missing += [first + k * gap / runs for k in range(1, runs)]
        else:
            silence = (horizon if horizon is not None else end) - first
            missing += [first + k * every for k in range(1, math.floor(silence / every) + 1)]
    lost = sum(1 for due in missing if start <= due < end)
    # Copies of one run sent by senders that drifted apart by more than half an interval form
    # runs of their own; the window still has only so many slots. (Not its slots less the lost
    # ones: a run sent half an interval late may be counted as a lost slot and the next one.)
    duplicates = max(duplicates, executions - slots)
    return Counts(slots, executions, duplicates, lost)


def by_slot(executed: Iterable[datetime], expected: Iterable[datetime]) -> Counts:
    """Count the runs of one task from the nominal slot of each execution.

    ``executed``: the slot (aware datetime) of every execution; ``expected``: the slots the
    schedule has in the window. Executions of slots outside ``expected`` are ignored.
    """
    wanted = set(expected)
    seen = Counter(slot for slot in executed if slot in wanted)
    return Counts(
        slots=len(wanted),
        executions=sum(seen.values()),
        duplicates=sum(n - 1 for n in seen.values()),
        lost=len(wanted - set(seen)),
    )
