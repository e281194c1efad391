"""docker-compose.yml cannot run here (no Docker engine); check its shape instead."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_services_are_postgres_redis_web_and_a_scalable_app():
    services = _compose()["services"]
    assert sorted(services) == ["app", "postgres", "redis", "web"]
    app = services["app"]
    assert "container_name" not in app and "ports" not in app  # --scale app=3 must work
    # One foreground process, a worker with its beat replica embedded: nothing in the background
    # that restart: unless-stopped would not restart.
    assert app["command"] == [
        "celery", "-A", "project", "worker", "-B", "--scheduler", "scheduling.schedulers:LedgerScheduler",
        "-l", "info", "--without-gossip", "--without-mingle",
    ]
    assert app["restart"] == "unless-stopped"


def test_the_image_runs_the_newest_supported_python():
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    newest = max(
        re.findall(r'"Programming Language :: Python :: (3\.\d+)"',
                   (COMPOSE.parent / "pyproject.toml").read_text()),
        key=lambda version: tuple(map(int, version.split("."))),
    )
    assert newest == "3.14"
    assert re.findall(r"(?m)^FROM (\S+)", dockerfile) == [f"python:{newest}-slim"]


def test_django_services_use_the_compose_postgres_and_redis():
    services = _compose()["services"]
    for name in ("web", "app"):
        env = services[name]["environment"]
        assert env["DATABASE_URL"] == "postgresql://postgres:postgres@postgres:5432/postgres"
        assert env["CELERY_BROKER_URL"] == "redis://redis:6379/0"
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert "migrate" in services["web"]["command"]


def test_app_healthcheck_is_the_health_command_on_its_own_replica():
    health = _compose()["services"]["app"]["healthcheck"]
    assert health["test"] == ["CMD", "python", "manage.py", "scheduling_health", "--local"]
    assert (health["interval"], health["timeout"], health["retries"]) == ("15s", "10s", 3)
    assert health["start_period"] == "30s"
