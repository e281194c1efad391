from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.acceptance.deployment import Deployment


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
