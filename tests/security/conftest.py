"""The security regression suite: one module per finding of the outside review, each test written to fail
before its fix. The API tests run against a real PostgreSQL, in a rolled-back transaction each, with the
integration tier's fixtures (a migrated database per session, the ``world`` of teams, roles and tokens)."""

from __future__ import annotations

from tests.integration.conftest import db, pg_engine, pg_url  # noqa: F401
from tests.support.api import api_app, client, world  # noqa: F401
