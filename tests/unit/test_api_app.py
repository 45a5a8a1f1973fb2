"""The API on the embedded default (a migrated SQLite file, no servers): problem+json, limits, auth, a job's
round trip, SSE, and the failure modes (database unreachable -> 503, unexpected -> 500 without a traceback)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api.app import create_app
from api.logstream import tail_offset
from api.ratelimit import TokenBucketLimiter
from api.routers.common import decode_cursor, encode_cursor
from core.db import make_engine
from core.models import Attempt
from core.services.bootstrap import bootstrap_admin
from core.services.errors import Conflict, InvalidInput
from core.settings import Settings
from tests.support.api import auth, migrated_sqlite

SPEC = {"name": "tiny", "team": "default", "recipe": {"name": "gpt"}, "resources": {"gpus": 0}}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with migrated_sqlite(tmp_path_factory.mktemp("kiln")) as eng:
        yield eng


@pytest.fixture(scope="module")
def admin_secret(engine: Engine) -> str:
    with Session(engine) as db:
        _, secret = bootstrap_admin(db=db, name="root")
        db.commit()
    return secret


@pytest.fixture(scope="module")
def home(engine: Engine) -> Path:
    return Path(str(engine.url.database)).parent


@pytest.fixture
def client(engine: Engine, home: Path) -> Iterator[TestClient]:
    app = create_app(Settings(home=home, max_body_bytes=4096), engine=engine)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _problem(r: Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["title"] and "Traceback" not in r.text
    return body


def test_bootstrap_refuses_a_second_admin_unless_forced(engine: Engine, admin_secret: str) -> None:
    with Session(engine) as db:
        with pytest.raises(Conflict):
            bootstrap_admin(db=db, name="other")
        user, secret = bootstrap_admin(db=db, name="root", force=True)
        assert user.is_admin and secret.startswith("kiln_") and secret != admin_secret
        db.rollback()


def test_submit_yaml_list_get_cancel_on_sqlite(client: TestClient, admin_secret: str) -> None:
    h = auth(admin_secret)
    text = Path("examples/gpt-tiny.yaml").read_text()
    r = client.post("/v1/jobs", content=text, headers={**h, "content-type": "application/yaml"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["state"], job["team"], job["qos"], job["gpu_type"]) == ("QUEUED", "default", "silver", "cpu")
    page = client.get("/v1/jobs", params={"limit": 1}, headers=h).json()
    assert page["items"][0]["id"] == job["id"]
    assert client.get(f"/v1/jobs/{job['id']}", headers=h).json()["submitted_at"].endswith("Z")
    r = client.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
    assert r.status_code == 202 and r.json()["state"] == "CANCELLED"
    types = [e["type"] for e in client.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["items"]]
    assert types == ["SUBMITTED", "CANCELLED"]


def test_body_limit_counts_bytes_without_content_length(client: TestClient, admin_secret: str) -> None:
    h = {**auth(admin_secret), "content-type": "application/yaml"}

    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b"# padding padding padding padding padding padding\n" * 10

    _problem(client.post("/v1/jobs", content=chunks(), headers=h), 413)
    _problem(client.post("/v1/jobs", content=b"x" * 5000, headers=h), 413)
    _problem(client.post("/v1/jobs", content=b"{}", headers={**h, "content-length": "abc"}), 400)
    small = "name: tiny\nteam: default\nrecipe: {name: gpt}\nresources: {gpus: 0}\n"
    assert client.post("/v1/jobs", content=small, headers=h).status_code == 201


def test_problem_documents_for_common_errors(client: TestClient, admin_secret: str) -> None:
    h = auth(admin_secret)
    body = _problem(client.get("/v1/jobs/abc", headers=h), 422)
    assert body["errors"][0]["loc"] == "path.job_id"
    body = _problem(client.get("/v1/jobs", params={"limit": 9999}, headers=h), 422)
    assert body["errors"][0]["loc"] == "query.limit"
    body = _problem(client.post("/v1/teams", json={"name": "x", "bogus": 1}, headers=h), 422)
    assert body["errors"][0]["loc"] == "bogus"
    _problem(client.get("/v1/nowhere", headers=h), 404)
    _problem(client.put("/v1/jobs", headers=h), 405)
    _problem(client.post("/v1/jobs", content=b"name: x", headers={**h, "content-type": "text/csv"}), 415)
    r = _problem(client.get("/v1/me"), 401)
    assert r["type"] == "https://kiln.dev/problems/unauthorized"


def _job_with_an_attempt(client: TestClient, h: dict[str, str], engine: Engine, home: Path) -> tuple[int, Path]:
    """A job submitted through the API with its first attempt recorded; its attempts' log directory, created."""
    job_id = client.post("/v1/jobs", json=SPEC, headers=h).json()["id"]
    with Session(engine) as db:
        db.add(Attempt(job_id=job_id, number=1, fencing_token=1, placement=[]))
        db.commit()
    logs = home / "storage" / "logs" / str(job_id)
    logs.mkdir(parents=True)
    return job_id, logs


def test_logs_follow_switches_to_a_restarted_attempt_and_ends(
    client: TestClient, admin_secret: str, engine: Engine, home: Path
) -> None:
    h = auth(admin_secret)
    job_id, logs = _job_with_an_attempt(client, h, engine, home)
    (logs / "1.log").write_text("one\ntwo\n")
    r = client.get(f"/v1/jobs/{job_id}/logs", headers=h)
    assert "data: one\n" in r.text and "data: two\n" in r.text and r.text.rstrip().endswith('"state": "QUEUED"}')
    assert client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 2}, headers=h).text.startswith("event: end")


def test_logs_tail_begins_with_the_last_lines(
    client: TestClient, admin_secret: str, engine: Engine, home: Path
) -> None:
    h = auth(admin_secret)
    job_id, logs = _job_with_an_attempt(client, h, engine, home)
    (logs / "1.log").write_text("".join(f"line {i}\n" for i in range(1, 2001)))

    def lines(**params: int) -> list[str]:
        body = client.get(f"/v1/jobs/{job_id}/logs", params=params, headers=h).text
        return [x.removeprefix("data: ") for x in body.splitlines() if x.startswith("data: line")]

    assert lines(tail=3) == ["line 1998", "line 1999", "line 2000"]
    assert lines(tail=0) == [] and len(lines(tail=5000)) == 2000 and len(lines()) == 2000
    assert [tail_offset(logs / "1.log", n, block=7) for n in (1, 2)] == [
        tail_offset(logs / "1.log", 1),
        tail_offset(logs / "1.log", 2),
    ]  # the same across block boundaries


def test_database_unreachable_is_503_with_retry_after(tmp_path: Path, admin_secret: str) -> None:
    dead = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/nothing", connect_args={"connect_timeout": 1})
    app = create_app(Settings(home=tmp_path), engine=dead)
    with TestClient(app, raise_server_exceptions=False) as c:
        for path in ("/readyz", "/v1/me"):
            r = c.get(path, headers=auth(admin_secret))
            body = _problem(r, 503)
            assert r.headers["retry-after"] == "5" and body["type"].endswith("/unavailable")
        assert c.get("/healthz").status_code == 200


def test_unexpected_errors_are_500_without_traceback(client: TestClient) -> None:
    app = client.app

    @app.get("/boom")  # type: ignore[attr-defined]
    def boom() -> None:
        raise RuntimeError("secret internals /etc/passwd")

    r = client.get("/boom")
    body = _problem(r, 500)
    assert "secret internals" not in r.text and body["detail"] == "an internal error occurred; it has been logged"


def test_token_bucket() -> None:
    limiter = TokenBucketLimiter(per_minute=60, burst=2)
    assert [limiter.take(1, now=0.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]
    assert limiter.take(2, now=0.0) == 0.0  # another key, another bucket
    assert limiter.take(1, now=1.0) == 0.0  # refilled one token per second
    assert limiter.take(1, now=1.0) > 0


def test_cursor_round_trip_and_rejection() -> None:
    assert decode_cursor(encode_cursor("before", 12345), "before") == 12345
    for bad in ("", "!!!", encode_cursor("before", 0), "eyJiZWZvcmUiOiAiMSJ9", encode_cursor("pos", 7)):
        with pytest.raises(InvalidInput):
            decode_cursor(bad, "before")


def test_openapi_documents_problems_and_both_submit_media_types(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    submit = doc["paths"]["/v1/jobs"]["post"]
    assert set(submit["requestBody"]["content"]) == {
        "application/json",
        "application/yaml",
        "application/x-yaml",
        "text/yaml",
    }
    assert "JobSpec" in doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "application/problem+json" in op["responses"]["500"]["content"], path
