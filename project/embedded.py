"""Embedded defaults, so a fresh machine needs no service.

``DATABASE_URL`` unset: a PostgreSQL server from the ``pgserver`` wheel, with its data folder
under ``.data/pg`` (git-ignored). The server is shared by every process that asks for it and keeps
running after they exit, so beat replicas, workers and the admin all talk to one database.

``CELERY_BROKER_URL`` unset: kombu's SQL transport on that same database (``project.broker``). It
needs no service, claims each message under a row lock, and keeps delivered messages
(``visible = false``), which the acceptance tests count as the broker's own record of what was sent.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """Return the folder that holds embedded state (``SCHEDULING_DATA_DIR`` or ``.data``)."""
    path = Path(os.environ.get("SCHEDULING_DATA_DIR", BASE_DIR / ".data"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def embedded_database_url() -> str:
    """Start (or join) the embedded PostgreSQL server and return its URL.

    Raises ImproperlyConfigured when ``pgserver`` is not installed.
    """
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
            "pip install 'django-scheduling-ledger[embedded]' or set DATABASE_URL."
        ) from exc
    server = pgserver.get_server(data_dir() / "pg", cleanup_mode=None)
    return server.get_uri()


def sql_broker_url(database_url: str) -> str:
    """Return kombu's SQL-transport URL for the PostgreSQL database at ``database_url``."""
    parts = urlsplit(database_url)
    return "sqlpoll+postgresql+psycopg://" + database_url[len(parts.scheme) + 3 :]
