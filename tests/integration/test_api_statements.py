"""SQL statements per request on the hot paths (submit, list), counted with a SQLAlchemy event listener.

The bench (bench/api_bench.py) measures throughput; this pins the statement budget so a change that adds a
query to every submission or an N+1 to the list fails here first. BEGIN/COMMIT are not cursor executions and so
are not counted; the connection's liveness check on checkout sends no statement (api/app.py).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests.support.api import World, spec
from tests.support.sql import statements

pytestmark = pytest.mark.integration

SUBMIT_BUDGET = 3  # auth; team + default contract + QoS; the write (job, contract, event, NOTIFY)
LIST_BUDGET = 2  # auth; the page (jobs joined with team, user and QoS names)


def test_submit_statement_budget(client: TestClient, world: World, db: Session, pg_engine: Engine) -> None:
    client.post("/v1/jobs", json=spec(name="warm"), headers=world.h("member"))  # first use: token touch
    with statements(pg_engine) as seen:
        r = client.post("/v1/jobs", json=spec(name="counted"), headers=world.h("member"))
    assert r.status_code == 201, r.text
    print(f"\nsubmit: {len(seen)} statements\n  " + "\n  ".join(s.split("\n")[0][:100] for s in seen))
    assert len(seen) <= SUBMIT_BUDGET, seen


def test_list_statement_budget_has_no_n_plus_one(
    client: TestClient, world: World, db: Session, pg_engine: Engine
) -> None:
    for i in range(5):
        assert client.post("/v1/jobs", json=spec(name=f"j{i}"), headers=world.h("member")).status_code == 201
    client.get("/v1/jobs", headers=world.h("member"))
    for limit in (2, 50):
        with statements(pg_engine) as seen:
            r = client.get(f"/v1/jobs?limit={limit}", headers=world.h("member"))
        assert r.status_code == 200, r.text
        print(f"\nlist limit={limit}: {len(seen)} statements\n  " + "\n  ".join(s.split("\n")[0][:100] for s in seen))
        assert len(seen) <= LIST_BUDGET, seen
