from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from tests.acceptance.deployment import Deployment, test_database_url


@pytest.fixture
def deployment(tmp_path, transactional_db) -> Iterator[Deployment]:
    """Child processes against the test database; all stopped (and logs shown) at the end."""
    deployment = Deployment(tmp_path)
    try:
        yield deployment
    finally:
        deployment.stop()
        for name in deployment.processes:
            print(f"--- {name} ---\n{deployment.tail(name, 15)}")


@dataclass(frozen=True)
class EmptyDatabase:
    """A database of its own on the test's server, never migrated."""

    name: str
    url: str  # DATABASE_URL form
    params: dict[str, Any]  # libpq connection parameters of the server (any database)


@pytest.fixture
def empty_database() -> Iterator[EmptyDatabase]:
    """Create an empty database on the test's server; yield it; drop it."""
    params = connection.get_connection_params()
    params = {k: v for k, v in params.items() if k not in ("cursor_factory", "context")}
    name = f"empty_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True)
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = urlunsplit(urlsplit(test_database_url())._replace(path=f"/{name}"))
        yield EmptyDatabase(name, url, params)
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)
        ))
        admin.close()


@pytest.fixture
def empty_database_url(empty_database: EmptyDatabase) -> str:
    """The URL of ``empty_database``."""
    return empty_database.url
