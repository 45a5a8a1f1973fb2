"""Integration fixtures: one migrated PostgreSQL database per test session, one rolled-back transaction per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.db import make_engine
from core.migrate import upgrade
from harness.services import temporary_database


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with temporary_database() as url:
        upgrade(url)
        yield url


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    # A test's one transaction (``db`` below) stays open across the test's own Python, which a loaded machine can
    # stretch past kiln's idle-in-transaction timeout (lease_s / 2): the server then ends the session and the next
    # request answers 503 (schemathesis, generating between requests, met it). That timeout is for frozen
    # processes, tested in the chaos and failover tests, not for this fixture.
    engine = make_engine(pg_url, connect_args={"options": "-c idle_in_transaction_session_timeout=0"})
    yield engine
    engine.dispose()


@pytest.fixture
def db(pg_engine: Engine) -> Iterator[Session]:
    """A session inside a transaction that is rolled back after the test; commits become savepoints."""
    with pg_engine.connect() as conn:
        outer = conn.begin()
        session = Session(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
        try:
            yield session
        finally:
            session.close()
            outer.rollback()


# API fixtures (api_app, client, world): defined in tests/support/api.py, shared by the tests/integration/test_api_*.
from tests.support.api import api_app, client, world  # noqa: E402, F401
