"""Exactly-once periodic runs for Django + Celery beat, claimed from a PostgreSQL run ledger."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

#: This release's version, read from the installed distribution's metadata: pyproject.toml's
#: ``version`` is the one place it is written. "unknown" for a copy of the package put on the
#: path without installing it.
try:
    __version__ = version("django-scheduling-ledger")
except PackageNotFoundError:
    __version__ = "unknown"
