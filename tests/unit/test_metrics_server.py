"""The replica's metrics server in a single process (no multiprocess folder), and a busy port."""

from __future__ import annotations

import logging
import socket
import urllib.request

from scheduling import metrics


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
