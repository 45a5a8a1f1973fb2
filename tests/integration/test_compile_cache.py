"""The compile cache's reuse made visible (core/services/compile_cache.py): each attempt's compile from the trainer's
events as the worker's relay writes them (tests/support/compile_events.py), a team's hit rate over a window, the
REST endpoints that carry them (the /metrics counters: tests/integration/test_ops_metrics.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Job
from core.repositories import jobs as jobs_repo
from core.services import compile_cache
from core.services.principal import Principal
from tests.support.api import World
from tests.support.compile_events import KEY, POISONED, SUMMARIES, TEAM, relay_compiles

pytestmark = pytest.mark.integration


@pytest.fixture
def alpha_job(db: Session, world: World) -> Job:
    job = db.get(Job, world.jobs["alpha"])
    assert job is not None
    relay_compiles(db, job)
    return job


def test_each_attempt_says_hit_or_miss_source_key_time_and_saving(db: Session, alpha_job: Job) -> None:
    root = Principal(user_id=0, name="root", user_is_admin=True, scopes=frozenset({"admin"}))
    attempts = list(jobs_repo.attempts(db, alpha_job.id))
    got = compile_cache.for_attempts(db, principal=root, job_id=alpha_job.id, attempts=attempts)

    assert [c.summary for c in got] == SUMMARIES
    first, rejected, hit, old, running = got
    assert (first.status, first.source, first.key, first.compile_s, first.published) == ("miss", None, KEY, 24.9, True)
    assert rejected.rejections == (compile_cache.Rejection("numeric_mismatch", POISONED, "team"),)
    assert (hit.status, hit.source, hit.load_s, hit.compile_s, hit.saved_s) == ("hit", "team", 0.3, 0.4, 21.3)
    # An older trainer's event: the key from its graph, "artifacts" named as today's team cache, no saving said.
    assert (old.source, old.key, old.saved_s) == ("team", KEY, None)
    assert running.status == "pending"
    # The attempt ended without a compile event: off, not "not yet".
    assert compile_cache.summarise([], attempts[:1], compile_off=False)[0].summary == "off"


def test_a_teams_hit_rate_over_a_window(db: Session, world: World, alpha_job: Job) -> None:
    now = utcnow()
    teams = {alpha_job.team_id: "alpha"}
    reuse = compile_cache.by_team(db, teams=teams, since=now - timedelta(days=7), until=now + timedelta(seconds=1))
    alpha = reuse[alpha_job.team_id]
    assert (alpha.compiled, alpha.hits, alpha.hit_rate, alpha.rejected) == (4, 2, 0.5, 1)
    assert alpha.saved_s == pytest.approx(21.3)

    later = compile_cache.by_team(db, teams=teams, since=now + timedelta(seconds=1), until=now + timedelta(days=1))
    assert later[alpha_job.team_id] == compile_cache.TeamReuse(team="alpha")
    assert later[alpha_job.team_id].hit_rate is None


def test_attempts_endpoint_and_job_page_carry_each_compile(client: TestClient, world: World, alpha_job: Job) -> None:
    r = client.get(f"/v1/jobs/{alpha_job.id}/attempts", params={"limit": 2}, headers=world.h("viewer"))
    assert r.status_code == 200, r.text
    page = r.json()
    assert [a["compile"]["summary"] for a in page["items"]] == SUMMARIES[:2]
    r = client.get(
        f"/v1/jobs/{alpha_job.id}/attempts", params={"cursor": page["next_cursor"]}, headers=world.h("viewer")
    )
    third = r.json()["items"][0]["compile"]
    assert third == {
        "status": "hit",
        "source": "team",
        "key": KEY,
        "compile_s": 0.4,
        "load_s": 0.3,
        "saved_s": 21.3,
        "published": False,
        "rejections": [],
        "fallback": None,
        "summary": SUMMARIES[2],
    }

    overview = client.get(f"/v1/dashboard/jobs/{alpha_job.id}", headers=world.h("viewer")).json()
    assert [a["compile"]["summary"] for a in overview["attempts"]] == SUMMARIES

    # Another team's member: the house's problem+json 404, nothing about the job.
    r = client.get(f"/v1/jobs/{alpha_job.id}/attempts", headers=world.h("beta-member"))
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"


def test_usage_and_cost_page_carry_the_teams_hit_rate(client: TestClient, world: World, alpha_job: Job) -> None:
    usage = client.get("/v1/usage", params={"team": "alpha"}, headers=world.h("member")).json()
    got = usage["teams"][0]["compile_cache"]
    assert got == {**TEAM, "saved_s": pytest.approx(TEAM["saved_s"])}

    cost = client.get("/v1/dashboard/cost", params={"days": 7}, headers=world.h("member")).json()
    assert [{**c, "saved_s": round(c["saved_s"], 6)} for c in cost["compile_cache"]] == [{"team": "alpha", **TEAM}]
    # beta compiled nothing, and alpha's reuse is not beta's to see.
    assert client.get("/v1/dashboard/cost", headers=world.h("beta-member")).json()["compile_cache"] == []
    r = client.get("/v1/dashboard/cost", params={"days": 0}, headers=world.h("member"))
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
