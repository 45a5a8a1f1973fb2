"""A team holds at most ``KILN_MAX_UNFINISHED_JOBS_PER_TEAM`` unfinished jobs (queued, held, running...): every way
in (a submission, a sweep, a clone, an adaptive sweep's proposals) is refused past it, with a 429 problem naming the
limit, and two submissions at once cannot both take the last place.

Before: nothing capped a team's queue; the review queued 2,048 jobs in 35 s through sweeps, each one more row for
every scheduling cycle to read. Now the submission locks the team's row and the insert counts the team's
unfinished jobs in the same transaction (PostgreSQL; the embedded SQLite default, which writes one transaction at
a time, counts first); a sweep that would pass the limit is refused whole; the scheduler closes an adaptive search
whose next job does not fit, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from cli.errors import ExitCode
from cli.main import app as cli_app
from cli.server.bootstrap import bootstrap
from core.db import make_engine
from core.migrate import upgrade
from core.models import Job, Membership, Sweep, Team, User
from core.services import jobs as jobs_svc
from core.services import teams as teams_svc
from core.services.errors import QueueFull
from core.services.principal import Principal
from core.spec import parse_spec_data
from core.states import TERMINAL
from core.sweeps.search import propose_due
from harness.services import free_port, temporary_database, wait_until_serving
from tests.support.api import World, build_world, make_app, spec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CAP = 5


def _unfinished(db: Session, team: str = "alpha") -> int:
    ended = [s.value for s in TERMINAL]
    stmt = select(func.count()).select_from(Job).join(Team, Team.id == Job.team_id)
    return int(db.scalar(stmt.where(Team.name == team, Job.state.not_in(ended))) or 0)


@pytest.fixture
def capped(db: Session, pg_engine: Engine, tmp_path: Path) -> Iterator[tuple[TestClient, World]]:
    with TestClient(make_app(pg_engine, tmp_path, db, max_unfinished_jobs_per_team=CAP)) as client:
        yield client, build_world(db, client)  # alpha has one queued job


def _queue_full(r: Any) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"].endswith("/queue-full") and f"{CAP}" in body["detail"], body
    assert "KILN_MAX_UNFINISHED_JOBS_PER_TEAM" in body["detail"] and body["errors"][0]["loc"] == "team"


def test_submissions_past_the_cap_are_refused(capped: tuple[TestClient, World], db: Session) -> None:
    client, world = capped
    h = world.h("member")
    codes = [client.post("/v1/jobs", json=spec(name=f"j{i}"), headers=h).status_code for i in range(3)]
    held = client.post("/v1/jobs?hold=true", json=spec(name="held"), headers=h)  # a held job is unfinished too
    assert codes == [201, 201, 201] and held.status_code == 201 and _unfinished(db) == CAP
    _queue_full(client.post("/v1/jobs", json=spec(name="one-more"), headers=h))
    _queue_full(
        client.post(
            "/v1/jobs",
            content="name: yaml\nteam: alpha\nrecipe: {name: gpt}\nsteps: 10\nresources: {gpus: 0, cpu_slots: 1}\n",
            headers={**h, "Content-Type": "application/yaml"},
        )
    )
    keyed = {**h, "Idempotency-Key": "k-1"}
    _queue_full(client.post("/v1/jobs", json=spec(name="keyed"), headers=keyed))
    assert _unfinished(db) == CAP
    # Another team has its own cap; a job that ends makes room.
    assert client.post("/v1/jobs", json=spec(team="beta", name="b"), headers=world.h("beta-member")).status_code == 201
    assert client.post(f"/v1/jobs/{held.json()['id']}/cancel", headers=h).status_code == 202
    assert client.post("/v1/jobs", json=spec(name="room"), headers=h).status_code == 201


def test_a_sweep_past_the_cap_is_refused_whole(capped: tuple[TestClient, World], db: Session) -> None:
    client, world = capped
    h = world.h("member")
    sweeps_before = db.scalar(select(func.count()).select_from(Sweep))
    doc = {**spec(name="grid"), "sweep": {"grid": {"lr": [0.1, 0.01, 0.001, 0.0001, 0.00001]}}}
    r = client.post("/v1/sweeps", json=doc, headers=h)
    _queue_full(r)
    assert "5 jobs" in r.json()["detail"]
    assert _unfinished(db) == 1 and db.scalar(select(func.count()).select_from(Sweep)) == sweeps_before
    doc["sweep"] = {"grid": {"lr": [0.1, 0.01, 0.001, 0.0001]}}  # 1 + 4: exactly the cap
    assert client.post("/v1/sweeps", json=doc, headers=h).status_code == 201 and _unfinished(db) == CAP


def test_an_adaptive_search_that_cannot_propose_closes_saying_why(
    capped: tuple[TestClient, World], db: Session
) -> None:
    client, world = capped
    doc = {
        **spec(name="lr"),
        "sweep": {
            "random": {"lr": {"log_uniform": [1e-4, 1e-2]}},
            "search": "tpe",
            "seed": 3,
            "count": 8,
            "initial": 2,
            "max_concurrent": 4,
        },
    }
    r = client.post("/v1/sweeps", json=doc, headers=world.h("member"))
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    for i in range(2):  # the team's queue is full: 1 + 2 + 2
        assert client.post("/v1/jobs", json=spec(name=f"f{i}"), headers=world.h("member")).status_code == 201
    assert propose_due(db=db, max_unfinished=CAP) == []
    sweep = db.get(Sweep, sweep_id, populate_existing=True)
    assert sweep is not None and sweep.closed_at is not None
    assert "KILN_MAX_UNFINISHED_JOBS_PER_TEAM" in str(sweep.closed_reason), sweep.closed_reason
    shown = client.get(f"/v1/sweeps/{sweep_id}", headers=world.h("member")).json()
    assert "unfinished jobs" in str(shown["search_closed"]), shown


# ------------------------------------------------------------------------------------- submissions at once


@pytest.fixture(scope="module")
def crowd() -> Iterator[tuple[sessionmaker[Session], Principal]]:
    """A database of its own with a team 'crowd' and a member: the submissions below commit, concurrently."""
    with temporary_database("kiln_queue_cap") as url:
        upgrade(url)
        engine = make_engine(url)
        factory = sessionmaker(bind=engine, expire_on_commit=False)
        with factory() as db:
            admin = User(name="root", is_admin=True)
            member = User(name="mark")
            db.add_all([admin, member])
            db.flush()
            root = Principal(
                user_id=admin.id, name="root", user_is_admin=True, scopes=frozenset({"read", "write", "admin"})
            )
            team = teams_svc.create_team(db=db, principal=root, name="crowd", quotas=[teams_svc.Quota("cpu", 4)])
            db.add(Membership(user_id=member.id, team_id=team.id, role="member"))
            db.commit()
            who = Principal(user_id=member.id, name="mark", roles={team.id: "member"})
        yield factory, who
        engine.dispose()


def test_submissions_at_once_never_pass_the_cap(crowd: tuple[sessionmaker[Session], Principal]) -> None:
    factory, who = crowd
    threads, per_thread, cap = 8, 6, 20
    start = threading.Barrier(threads)
    refused: list[int] = []

    def submit(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            with factory() as db:
                try:
                    jobs_svc.submit(
                        db=db,
                        principal=who,
                        spec=parse_spec_data(spec(team="crowd", name=f"c{t}-{i}")),
                        max_unfinished=cap,
                    )
                    db.commit()
                except QueueFull:
                    db.rollback()
                    refused.append(t)

    workers = [threading.Thread(target=submit, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    with factory() as db:
        assert _unfinished(db, "crowd") == cap
    assert len(refused) == threads * per_thread - cap


# ------------------------------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def small_kiln(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real API process on the embedded default (SQLite) with a cap of 2: (url, admin token)."""
    home = tmp_path_factory.mktemp("kiln-cap")
    db_url = f"sqlite:///{home / 'kiln.db'}"
    upgrade(db_url)
    token = bootstrap(db_url, name="admin").token
    port = free_port()
    env = dict(os.environ, KILN_HOME=str(home), KILN_DATABASE_URL=db_url, KILN_MAX_UNFINISHED_JOBS_PER_TEAM="2")
    log = (home / "api.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{url}/readyz", proc, timeout=60, log=home / "api.log")
        yield url, token
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def test_the_cli_says_the_queue_is_full_with_its_exit_code(
    small_kiln: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, token = small_kiln
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("KILN_API_URL", url)
    monkeypatch.setenv("KILN_TOKEN", token)
    example = ROOT / "examples" / "gpt-tiny.yaml"
    runner = CliRunner()

    def kiln(*args: str) -> Any:
        return runner.invoke(cli_app, list(args), terminal_width=250)

    first = kiln("submit", str(example), "-o", "json")
    assert first.exit_code == 0, first.output
    assert kiln("submit", str(example)).exit_code == 0
    for refused in (kiln("submit", str(example)), kiln("clone", str(json.loads(first.stdout)["id"]))):
        assert refused.exit_code == ExitCode.RATE_LIMITED == 9, refused.output
        assert "too many unfinished jobs" in refused.output and "KILN_MAX_UNFINISHED_JOBS_PER_TEAM" in refused.output
        assert "rate limited" not in refused.output
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(example.read_text() + "sweep:\n  grid: {lr: [0.1, 0.2]}\n")
    refused = kiln("sweep", "submit", str(sweep))
    assert refused.exit_code == 9 and "too many unfinished jobs" in refused.output, refused.output
