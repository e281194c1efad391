"""The replica's metrics server in a single process (no multiprocess folder), a busy port, and
the address it binds by default (issue 32)."""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from scheduling import metrics
from scheduling.conf import conf

ROOT = Path(__file__).resolve().parents[2]


def test_serve_exposes_this_process_metrics(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics.observe_suppressed("unit: serve", "w1@host")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics.serve(port, "127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    line = 'scheduling_duplicates_suppressed_total{task="unit: serve",worker="w1@host"} 1.0'
    assert line in text.splitlines()


def test_a_busy_port_is_logged_and_does_not_raise(caplog):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="scheduling.metrics"):
            metrics.serve(port, "127.0.0.1")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "cannot serve metrics on 127.0.0.1"
    ]


def _listening(port: int) -> list[str]:
    """The local addresses of the IPv4 sockets listening on ``port`` (``/proc/net/tcp``)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # TCP_LISTEN
            found.append(socket.inet_ntoa(struct.pack("<I", int(address, 16))))
    return found


def test_the_metrics_serve_this_host_only_by_default(settings):
    """Issue 32: the metrics answer without credentials, so by default only 127.0.0.1 gets them:
    the setting's default, ``serve``'s default and the example project's (no environment)."""
    del settings.SCHEDULING_METRICS_ADDR  # the app's own default, as in a project without it
    assert conf.metrics_addr == "127.0.0.1"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics.serve(port)
    assert _listening(port) == ["127.0.0.1"]


@pytest.mark.parametrize(("environment", "expected"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
def test_the_example_project_reads_the_metrics_address_from_the_environment(environment, expected):
    env = {k: v for k, v in os.environ.items() if k != "SCHEDULING_METRICS_ADDR"}
    if environment is not None:
        env["SCHEDULING_METRICS_ADDR"] = environment
    env["DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/nothing"  # parsed, never reached
    done = subprocess.run(
        [sys.executable, "-c", "import project.settings as s; print(s.SCHEDULING_METRICS_ADDR)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    assert done.stdout.strip() == expected
