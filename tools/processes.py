"""Beat replicas and workers as child processes, for the chaos tool and the acceptance tests.

A ``Processes`` starts ``celery -A <app> beat`` replicas with ``LedgerScheduler``, ``celery -A
<app> worker`` processes and workers with a replica embedded (``worker -B``), each in a session
(process group) of its own with its log in ``workdir``, and can kill, pause, resume, restart and
stop them by name. Workers consume one
queue and get ``SCHEDULING_EXECUTION_LOG`` in their environment: a task such as the example
project's ``project.tasks.record`` appends one JSON line per execution there, so executions are
counted from the workers themselves, not from the ledger (``executions``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: The line ``celery beat`` and ``celery worker`` log when they are up.
READY = {"beat": "beat: Starting...", "worker": "ready."}
#: The scheduler class of every beat replica unless ``start_beat`` is given another.
LEDGER_SCHEDULER = "scheduling.schedulers:LedgerScheduler"


class Processes:
    """Child processes by name; ``stop()`` ends them all (SIGTERM, then SIGKILL).

    ``env`` is added to this process's environment for every child; ``cwd`` is where ``celery``
    runs (the folder from which ``app`` is importable).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        queue: str,
        app: str = "project",
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.queue = queue
        self.app = app
        self.cwd = cwd or Path.cwd()
        self.execution_log = workdir / "executions.jsonl"
        self.execution_log.touch()
        self.env = {
            **os.environ,
            "SCHEDULING_EXECUTION_LOG": str(self.execution_log),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.kinds: dict[str, str] = {}
        self._args: dict[str, tuple[list[str], dict[str, str], list[str]]] = {}
        self.ready: dict[str, str] = {}  # the ready line of each process ``start_command`` started
        self.paused: set[str] = set()
        #: A command prefix per process name, set before it starts: ``["ip", "netns", "exec",
        #: NAME]`` runs it in a network namespace (the prefix must exec the command, so the
        #: process id stays the command's).
        self.prefixes: dict[str, list[str]] = {}

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _start(
        self, name: str, args: list[str], env: dict[str, str], program: list[str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``program`` (default: this Python's ``celery -A <app>``) with ``args``."""
        if program is None:
            program = [sys.executable, "-m", "celery", "-A", self.app]
        self._args[name] = (args, env, program)
        with open(self.log_path(name), "ab") as handle:
            process = subprocess.Popen(
                [*self.prefixes.get(name, ()), *program, *args],
                cwd=self.cwd,
                env={**self.env, **env},
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = process
        self.paused.discard(name)
        return process

    def start_command(self, name: str, command: list[str], ready: str,
                      **env: str) -> subprocess.Popen[bytes]:
        """Start ``command`` (a whole argv, not Celery's) as ``name``, in ``cwd`` with the
        deployment's environment and ``env``; ``ready`` is the line it logs once up
        (``wait_ready``). It is stopped as a beat is: SIGTERM to its process group."""
        self.kinds[name] = "command"
        self.ready[name] = ready
        return self._start(name, command, env, program=[])

    def start_beat(
        self, name: str, *, scheduler: str = LEDGER_SCHEDULER, **env: str
    ) -> subprocess.Popen[bytes]:
        """Start a beat replica whose replica id is ``name``, running ``scheduler`` (``-S``)."""
        self.kinds[name] = "beat"
        return self._start(
            name,
            ["beat", "-l", "info", "--pidfile=", "-S", scheduler],
            {"SCHEDULING_REPLICA_ID": name, **env},
        )

    def start_worker(self, name: str, concurrency: int = 2, **env: str) -> subprocess.Popen[bytes]:
        """Start a prefork worker ``name@<queue>.<host>`` consuming this deployment's queue.

        The queue in the node name keeps workers of two deployments that share a broker apart:
        RabbitMQ gives a worker's remote-control queue (named after the node) to one connection.
        """
        self.kinds[name] = "worker"
        return self._start(name, ["worker", *self._worker_options(name, concurrency)], env)

    def start_worker_beat(
        self, name: str, concurrency: int = 2, *, scheduler: str = LEDGER_SCHEDULER, **env: str
    ) -> subprocess.Popen[bytes]:
        """Start a worker with a beat replica embedded: ``celery worker -B --scheduler SCHEDULER``.

        Not ``-S``: a worker's ``-S`` is its state database (``--statedb``), not beat's scheduler.

        The embedded beat's replica id is ``name``. The worker logs both ready lines (``READY``);
        ``wait_ready`` waits for the worker's, ``wait_for_log(name, READY["beat"])`` for beat's.
        It is stopped as a worker is.
        """
        self.kinds[name] = "worker"
        return self._start(
            name,
            ["worker", "-B", "--scheduler", scheduler, *self._worker_options(name, concurrency)],
            {"SCHEDULING_REPLICA_ID": name, **env},
        )

    def _worker_options(self, name: str, concurrency: int) -> list[str]:
        return [
            "-l", "info", "-c", str(concurrency), "-n", f"{name}@{self.queue}.%h",
            "-Q", self.queue, "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``name`` again with the arguments it was first started with (it must be dead)."""
        args, env, program = self._args[name]
        return self._start(name, args, env, program)

    def alive(self, name: str) -> bool:
        return self.processes[name].poll() is None

    def wait_for_log(self, name: str, text: str, timeout: float = 30.0, after: int = 0) -> float:
        """Wait until ``text`` appears in ``name``'s log past byte ``after``; return time.time().

        Raises AssertionError when the process exits first or on timeout, with the log's tail.
        """
        deadline = time.monotonic() + timeout
        path = self.log_path(name)
        while time.monotonic() < deadline:
            if path.exists() and text in path.read_bytes()[after:].decode(errors="replace"):
                return time.time()
            process = self.processes.get(name)
            if process is not None and process.poll() is not None:
                raise AssertionError(f"{name} exited early:\n{self.tail(name)}")
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not seen in {name} within {timeout}s:\n{self.tail(name)}")

    def wait_ready(self, *names: str, timeout: float = 60.0) -> None:
        """Wait until every named process (all when none is named) has logged its ready line."""
        for name in names or tuple(self.processes):
            text = self.ready.get(name) or READY[self.kinds.get(name, "worker")]
            self.wait_for_log(name, text, timeout=timeout)

    def send(self, name: str, sig: int) -> None:
        """Send ``sig`` to ``name``'s whole process group (a worker's pool processes too)."""
        try:
            os.killpg(self.processes[name].pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGSTOP:
            self.paused.add(name)
        elif sig == signal.SIGCONT:
            self.paused.discard(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal ``name``'s process group; for SIGKILL and SIGTERM, wait for it to exit."""
        self.send(name, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            if name in self.paused:
                self.send(name, signal.SIGCONT)
            self.processes[name].wait(timeout=30)
            self._reap_group(name)

    def _reap_group(self, name: str) -> None:
        try:  # pool processes left behind by a killed worker
            os.killpg(self.processes[name].pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, *names: str, timeout: float = 20.0, warm: bool = False) -> None:
        """Stop the named processes (all when none is named): SIGTERM, then SIGKILL.

        A worker gets SIGQUIT (Celery's cold shutdown: running tasks are cut, as SIGTERM to its
        whole group would) on its main process only, which ends its pool processes itself. A pool
        process signalled directly can die holding the pool's queue lock, and then the main
        process never exits (billiard's threaded pool, which Celery uses without an event loop:
        on kombu's SQL transport), so the stop lasted until its SIGKILL. With ``warm`` a worker
        gets SIGTERM on its main process only (Celery's warm shutdown: the tasks it is running
        finish, within ``timeout`` seconds, before the SIGKILL).
        """
        targets = list(names or self.processes)
        for name in targets:
            if self.alive(name):
                if self.kinds.get(name) == "worker":
                    os.kill(self.processes[name].pid, signal.SIGTERM if warm else signal.SIGQUIT)
                else:
                    self.send(name, signal.SIGTERM)
                self.send(name, signal.SIGCONT)  # a stopped process handles the signal once woken
        deadline = time.monotonic() + timeout
        for name in targets:
            process = self.processes[name]
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            self._reap_group(name)

    def executions(self, phase: str = "end") -> list[dict[str, object]]:
        """Every execution the workers recorded, in order (``phase="start"``: every start)."""
        return read_executions(self.execution_log, phase)

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log_path(name)
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def read_executions(path: Path, phase: str = "end") -> list[dict[str, object]]:
    """Read an execution log (JSON lines; see ``project.tasks.record``): the lines of ``phase``.

    A line cut short by a process killed while writing it is skipped.
    """
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("phase", "end") == phase:
            records.append(record)
    return records
