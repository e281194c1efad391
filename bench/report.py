"""The benchmark's one table: absolute figures, the ratio and the target of every row."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

COLUMNS = ("scenario", "measure", "ours", "stock", "redbeat (lock 1,500 s)", "redbeat (tuned lock)",
           "redlock per container", "django-periodic-tasks", "raw publish", "ratio", "target",
           "met")


@dataclass
class Row:
    """One line of the table; empty strings where a system does not apply.

    ``met`` is True or False for a row with a target, None for a row that is only a figure.
    """

    scenario: str
    measure: str
    ours: str
    stock: str = ""
    redbeat: str = ""
    redbeat_tuned: str = ""
    redlock: str = ""
    dpt: str = ""  # django-periodic-tasks (bench.dpt_peer)
    raw: str = ""
    ratio: str = ""
    target: str = ""
    met: bool | None = None

    def cells(self) -> list[str]:
        met = {True: "met", False: "NOT MET", None: ""}[self.met]
        peers = [self.stock, self.redbeat, self.redbeat_tuned, self.redlock, self.dpt, self.raw]
        return [self.scenario, self.measure, self.ours, *(cell or "-" for cell in peers),
                self.ratio or "-", self.target or "-", met or "-"]


def table(rows: list[Row]) -> str:
    """Render the rows as a Markdown table (also what the console shows)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def seconds(value: float) -> str:
    return f"{value:.3f} s"


def ms(value: float) -> str:
    return f"{value * 1000:.1f} ms"


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


@dataclass
class Attempts:
    """Run scenarios so that one that raises costs its own rows, not the run's.

    An instance called as ``attempt(name, call, empty)`` returns ``call()``; when it raises, it
    logs the traceback, appends a failed row (NOT MET, the error) to ``rows``, adds ``name`` to
    ``failed``, copies ``logs`` (the run's temporary folder of process logs, when given) to a
    folder of its own that outlives the run, and returns ``empty``.
    """

    rows: list[Row]
    log: Callable[[str], None]
    logs: Path | None = None
    failed: list[str] = field(default_factory=list)

    def __call__(self, name: str, call: Callable, empty=()):
        self.log(f"{name} ...")
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - reported in the table and the exit code
            self.log(f"{name} FAILED:\n{traceback.format_exc()}")
            self.failed.append(name)
            self.rows.append(Row(name, "the scenario ran to its end", f"failed: {exc}",
                                 target="ran", met=False))
            if self.logs is not None:
                kept = Path(tempfile.mkdtemp(prefix="bench-failed-"))
                shutil.copytree(self.logs, kept, dirs_exist_ok=True)
                self.log(f"{name}: the processes' logs are kept in {kept}")
            return empty
