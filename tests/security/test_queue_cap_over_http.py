"""A team's unfinished-jobs cap holds for concurrent submissions through the API itself, against real PostgreSQL.

Before: the API's submit runs its statements in autocommit (api.deps.autocommit), so the team's row lock that the
first read took (``FOR NO KEY UPDATE``) ended with that statement, before the write counted the team's unfinished
jobs; two writes at once each counted the other's job out and both got in: 32 submissions at once against a cap
of 8 left 9 to 16 unfinished jobs (7 of 9 rounds failed on the old code; a race, so not every round). The
service-level test (test_queue_cap.py) runs each submission in a transaction of its own and never saw it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from core.db import make_engine
from core.migrate import upgrade
from core.models import Job, Membership, Team, User
from core.services import teams as teams_svc
from core.services import tokens as tokens_svc
from core.services.principal import Principal
from core.states import UNFINISHED
from harness.services import temporary_database
from tests.support.api import auth, make_app, spec
from tests.support.sql import statements

pytestmark = pytest.mark.integration

CAP = 8
CLIENTS = 32


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with temporary_database("kiln_queue_cap_http") as url:
        upgrade(url)
        made = make_engine(url)
        yield made
        made.dispose()


def _member_tokens(engine: Engine, team: str, count: int) -> list[str]:
    """A team of its own and a member with ``count`` tokens (one per client, as the API bench's clients)."""
    with Session(engine) as db:
        admin = User(name=f"root-{team}", is_admin=True)
        member = User(name=f"mark-{team}")
        db.add_all([admin, member])
        db.flush()
        root = Principal(user_id=admin.id, name=admin.name, user_is_admin=True, scopes=frozenset({"admin"}))
        made = teams_svc.create_team(db=db, principal=root, name=team, quotas=[teams_svc.Quota("cpu", 4)])
        db.add(Membership(user_id=member.id, team_id=made.id, role="member"))
        who = Principal(user_id=member.id, name=member.name, roles={made.id: "member"})
        secrets = [tokens_svc.issue(db=db, principal=who, name=f"c{i}")[1] for i in range(count)]
        db.commit()
    return secrets


def _unfinished(engine: Engine, team: str) -> int:
    with Session(engine) as db:
        stmt = select(func.count()).select_from(Job).join(Team, Team.id == Job.team_id)
        return int(db.scalar(stmt.where(Team.name == team, Job.state.in_(UNFINISHED))) or 0)


@pytest.mark.parametrize("earlier", [0, 1, 5])
def test_concurrent_submissions_over_http_never_pass_the_cap(engine: Engine, tmp_path: Path, earlier: int) -> None:
    """``earlier`` jobs submitted one by one first: the team's bound is then known, and the burst takes the places
    left without counting until the cap, where each submission counts."""
    team = f"crowd{earlier}"
    tokens = _member_tokens(engine, team, CLIENTS)
    statuses: list[int] = []
    start = threading.Barrier(CLIENTS)
    app = make_app(engine, tmp_path, max_unfinished_jobs_per_team=CAP, rate_limit_burst=10**6)
    with TestClient(app) as client:
        for i in range(earlier):
            assert (
                client.post("/v1/jobs", json=spec(team=team, name=f"e{i}"), headers=auth(tokens[0])).status_code == 201
            )

        def submit(i: int) -> None:
            start.wait()
            r = client.post("/v1/jobs", json=spec(team=team, name=f"j{i}"), headers=auth(tokens[i]))
            statuses.append(r.status_code)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert sorted(set(statuses)) == [201, 429], statuses
    assert statuses.count(201) == CAP - earlier, statuses
    assert _unfinished(engine, team) == CAP


def test_the_apis_own_submit_sends_four_statements(engine: Engine, tmp_path: Path) -> None:
    """The API's submit, in autocommit as it runs (test_api_statements.py's client shares a test transaction, where
    it sends 3): the token, the team's context, the write (its commit does not wait for the WAL's flush, so the
    team's row is free at once) and the update of the new job's row whose ordinary commit makes the write durable
    before the 201."""
    tokens = _member_tokens(engine, "counted", 1)
    app = make_app(engine, tmp_path, max_unfinished_jobs_per_team=CAP)
    with TestClient(app) as client:
        first = client.post("/v1/jobs", json=spec(team="counted", name="first"), headers=auth(tokens[0]))
        assert first.status_code == 201, first.text  # the team's first: its bound is counted
        with statements(engine) as seen:
            r = client.post("/v1/jobs", json=spec(team="counted", name="second"), headers=auth(tokens[0]))
    assert r.status_code == 201, r.text
    assert len(seen) == 4, seen
    assert "set_config('synchronous_commit', 'off', true)" in seen[2], seen[2]
    assert seen[3].startswith("UPDATE jobs SET updated_at = updated_at"), seen[3]
