"""Where the replicas' CPU goes: py-spy samples of running processes, summed by function.

``python -m bench --profile DIR`` attaches ``py-spy record`` (sampling, 100 Hz, the process is
not paused: ``--nonblocking``) to the replicas of the scenarios that call ``profiled``, for the
part of the scenario that is measured, and writes for each scenario ``DIR/<label>-<pid>.txt``
(py-spy's collapsed stacks, one ``frame;frame;... count`` line per stack) and ``DIR/<label>.md``,
the functions that held the most samples, from every profiled process together. The samples
count CPU only (a thread waiting for a socket or a lock is left out; py-spy without ``--idle``),
so the shares are shares of the replicas' CPU time, which is what limits a rate on a shared
machine. py-spy is on the package index (``pip install py-spy``); it needs ptrace rights on the
processes (root, or the same user with ``kernel.yama.ptrace_scope`` 0).

A profile costs the machine a little CPU and the process a little time per sample: a full run
(the one that writes docs/benchmarks.md) is not profiled.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Samples per second and process.
RATE = 100
#: Functions listed per summary, by inclusive share.
TOP = 40

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
# A frame is "function (path:line)"; the line is the one executing, so one function has many.
_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>.*?)(?::\d+)?\)$")
_PACKAGES = re.compile(r"^.*/(?:site-packages|lib/python3\.\d+)/")


@contextmanager
def profiled(
    folder: Path | None, label: str, pids: list[int], *, idle: bool = False
) -> Iterator[None]:
    """Sample ``pids`` with py-spy while the block runs; write the summary after it.

    With ``idle``, samples of threads waiting (a socket's reply, a lock) count too (py-spy's
    ``--idle``): the shares are then shares of the processes' wall time, where round trips show.
    Does nothing when ``folder`` is None. Raises RuntimeError when py-spy is not installed;
    a py-spy that exits early (the process ended) leaves its file as far as it got.
    """
    if folder is None:
        yield
        return
    beside = Path(sys.executable).with_name("py-spy")  # a virtualenv's, when not on PATH
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("--profile needs py-spy: pip install py-spy")
    folder.mkdir(parents=True, exist_ok=True)
    recorders = []
    for pid in pids:
        output = folder / f"{label}-{pid}.txt"
        recorders.append((output, subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--rate", str(RATE), "--format", "raw",
             "--nonblocking", *(["--idle"] if idle else []), "--output", str(output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )))
    try:
        yield
    finally:
        for _, recorder in recorders:
            if recorder.poll() is None:
                recorder.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        for _, recorder in recorders:
            recorder.wait(timeout=60)
    stacks = [output for output, _ in recorders if output.exists()]
    (folder / f"{label}.md").write_text(summary(label, stacks, idle=idle))


def summary(label: str, files: list[Path], *, idle: bool = False) -> str:
    """A Markdown table of the functions with the most samples in py-spy's collapsed ``files``.

    Inclusive share: samples with the function anywhere on the stack (counted once per stack),
    over every sample; self share: samples with it on top. Functions are named
    ``function (path)``, the path relative to site-packages or the standard library.
    """
    inclusive, own, total = Counter(), Counter(), 0
    for path in files:
        for line in path.read_text().splitlines():
            match = _LINE.match(line)
            if match is None:
                continue
            count = int(match["count"])
            frames = [_name(frame) for frame in match["stack"].split(";")]
            total += count
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    kind = "wall time: waits included" if idle else "CPU only"
    lines = [f"# Profile: {label}", "",
             f"{total:,} samples at {RATE} Hz from {len(files)} processes ({kind}).", "",
             "| function | inclusive | self |", "|---|---|---|"]
    for frame, count in _most(inclusive, TOP):
        lines.append(f"| `{frame}` | {_share(count, total)} | {_share(own[frame], total)} |")
    lines += ["", "Most samples on top of the stack:", "", "| function | self |", "|---|---|"]
    for frame, count in _most(own, TOP // 2):
        lines.append(f"| `{frame}` | {_share(count, total)} |")
    return "\n".join(lines) + "\n"


def per_execution(files: list[Path], executions: int, parts: list[tuple[str, tuple[str, ...]]]
                  ) -> list[tuple[str, float]]:
    """Milliseconds of sampled time per execution in each part, from py-spy's collapsed ``files``.

    A stack counts for the first part of ``parts`` (name, substrings of a frame) one of whose
    substrings is in it, else for "other"; each sample is 1/``RATE`` s of one process. Returns
    (part, ms) for every part with samples, in ``parts``' order, "other" last.
    """
    counts: Counter = Counter()
    for path in files:
        for line in path.read_text().splitlines():
            match = _LINE.match(line)
            if match is None:
                continue
            part = next((name for name, keys in parts if any(k in match["stack"] for k in keys)),
                        "other")
            counts[part] += int(match["count"])
    names = [name for name, _ in parts] + ["other"]
    return [(name, 1000 * counts[name] / RATE / executions) for name in names if counts[name]]


def _most(counts: Counter, n: int) -> list[tuple[str, int]]:
    """The ``n`` largest counts, ties in the functions' alphabetical order (a stable table)."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]


def _name(frame: str) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    return f"{match['function']} ({_PACKAGES.sub('', match['path'])})"


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.1f} %" if total else "-"
