"""The security regression suite: one module per finding of the outside review, each test written to fail
before its fix. The API tests run against a real PostgreSQL, in a rolled-back transaction each, with the
integration tier's fixtures (a migrated database per session, the ``world`` of teams, roles and tokens); those
that need the API as its clients see it share one real API process (``live``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import db, pg_engine, pg_url  # noqa: F401
from tests.security.live import Live, live_api
from tests.support.api import api_app, client, world  # noqa: F401


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A real API process with a QUEUED job, an attempt and its log (tests/security/live.py)."""
    with live_api(tmp_path_factory.mktemp("kiln-live")) as api:
        yield api
