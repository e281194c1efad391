"""docker-compose.yml cannot run here (no Docker engine); check its shape instead."""

from __future__ import annotations

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
    assert "celery -A project worker" in app["command"]
    assert "celery -A project beat" in app["command"]
    assert "--pidfile=" in app["command"]


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
