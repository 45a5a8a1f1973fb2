"""Every list endpoint pages the same way (docs/api.md, Pagination), found from the OpenAPI document itself.

A GET whose 200 answer is a bare JSON array, or an ``{items: [...]}`` page without ``limit``/``cursor`` and
``next_cursor``, fails here: a new list endpoint cannot be added without pagination. Each one is then walked a
page at a time (``limit=1`` and ``limit=2``), and the pages together must be the whole list, in the same order,
with nothing twice, ending on ``next_cursor: null``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from core.models import GPU, Artifact, Attempt, Checkpoint, CheckpointExport, Host, User
from core.services import tokens as tokens_svc
from core.services.principal import Principal
from tests.support.api import World, auth, build_world, make_app, spec

pytestmark = pytest.mark.integration

# Answers with an ``items`` array that are not lists of records, and why.
NOT_LISTS = {
    "/v1/jobs/{job_id}/metrics": "a telemetry series, downsampled to at most max_points and read on with after_step",
}


@pytest.fixture
def app_client(db: Session, pg_engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(make_app(pg_engine, tmp_path, db, webhook_allow_private_targets=True)) as c:
        yield c


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = doc
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def list_operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """path -> GET operation, for every GET whose 200 JSON answer is an array or holds an ``items`` array."""
    found: dict[str, dict[str, Any]] = {}
    for path, item in doc["paths"].items():
        op = item.get("get")
        content = ((op or {}).get("responses", {}).get("200", {}).get("content") or {}).get("application/json")
        if not content or "schema" not in content:
            continue
        schema = _resolve(doc, content["schema"])
        items = _resolve(doc, schema.get("properties", {}).get("items", {}))
        if schema.get("type") == "array" or items.get("type") == "array":
            found[path] = op  # type: ignore[assignment]
    return found


def _populate(db: Session, client: TestClient, world: World, storage: Path) -> dict[str, Any]:
    """At least two of everything, so a walk at limit=1 takes several pages."""
    admin, ta, member = world.h("admin"), world.h("team-admin"), world.h("member")
    for name in ("set-b", "set-a"):
        (storage / "datasets" / "alpha" / name).mkdir(parents=True)
        r = client.post("/v1/teams/alpha/datasets", json={"name": name, "path": f"datasets/alpha/{name}"}, headers=ta)
        assert r.status_code == 201, r.text
    for name in ("carol", "dave", "erin"):
        assert client.post("/v1/users", json={"name": name}, headers=admin).status_code == 201
    assert client.post("/v1/teams", json={"name": "gamma"}, headers=admin).status_code == 201
    assert client.put("/v1/teams/gamma/members/alice", json={"role": "team-admin"}, headers=admin).status_code == 201
    for team in ("alpha", "gamma"):  # erin is invited twice, carol and dave once
        for user in ("erin", "carol", "dave") if team == "alpha" else ("erin",):
            r = client.put(f"/v1/teams/{team}/members/{user}", json={"role": "member"}, headers=ta)
            assert r.status_code == 202, r.text
    for name in ("one", "two"):
        assert client.post("/v1/tokens", json={"name": name}, headers=admin).status_code == 201
    job_id = world.jobs["alpha"]
    assert client.post("/v1/jobs", json=spec(name="second"), headers=member).status_code == 201
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=member).status_code == 202  # a second event
    sweeps = []
    for name in ("sw-a", "sw-b"):
        doc = {**spec(name=name), "sweep": {"grid": {"lr": [0.001, 0.003, 0.01]}}}
        r = client.post("/v1/sweeps", json=doc, headers=member)
        assert r.status_code == 201, r.text
        sweeps.append(r.json()["id"])
    hooks = []
    for events in (["failed"], ["finished"]):
        r = client.post(
            "/v1/webhooks", json={"team": "alpha", "url": "http://127.0.0.1:9/h", "events": events}, headers=ta
        )
        assert r.status_code == 201, r.text
        hooks.append(r.json()["id"])
    for _ in range(3):
        assert client.post(f"/v1/webhooks/{hooks[0]}/test", headers=ta).status_code == 202
    for name in ("h-b", "h-a", "h-c"):
        host = Host(name=name, queue=f"host.{name}", state="UP")
        db.add(host)
        db.flush()
        db.add_all(
            GPU(host_id=host.id, uuid=f"GPU-{name}-{i}", index=i, model="H200", memory_bytes=141 << 30)
            for i in range(2)
        )
    for n in (1, 2, 3):
        attempt = Attempt(job_id=job_id, number=n, fencing_token=n, placement=[{"host": "h-a", "slots": 1}])
        db.add(attempt)
        db.flush()
        db.add(Checkpoint(job_id=job_id, attempt_id=attempt.id, step=10 * n, path=f"/x/{n}", bytes=1, sha256="a" * 64))
        db.add(CheckpointExport(job_id=job_id, step=10 * n))
        team_id = db.get(Attempt, attempt.id).job.team_id  # type: ignore[union-attr]
        db.add(Artifact(team_id=team_id, digest=f"{n:064x}", bytes=1, unpacked_bytes=1, entries=1))
    db.flush()
    return {"team": "alpha", "job_id": job_id, "sweep_id": sweeps[0], "hook_id": hooks[0]}


# Who reads each list (default: the admin, who sees everything), and a query that selects what it lists.
READERS = {"/v1/me/invitations": "erin", "/v1/jobs/{job_id}/exports": "member"}  # exports: the job's team only


IDENTITY = ("id", "uuid", "digest", "number", "step", "name", "user", "team")


def identity(item: dict[str, Any]) -> tuple[Any, ...]:
    """What names an item (its other fields may move between two reads: a wait, a token's last use)."""
    return tuple(item.get(k) for k in IDENTITY)


def walk(client: TestClient, path: str, headers: dict[str, str], limit: int) -> list[Any]:
    items: list[Any] = []
    cursor = None
    for _ in range(1000):
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        r = client.get(path, params=params, headers=headers)
        assert r.status_code == 200, (path, r.text)
        page = r.json()
        assert len(page["items"]) <= limit, path
        items += [identity(i) for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
        assert page["items"], f"{path}: an empty page that is not the last"
    raise AssertionError(f"{path}: no last page")


def test_every_list_endpoint_pages_by_limit_and_cursor(app_client: TestClient, db: Session, tmp_path: Path) -> None:
    client = app_client
    world = build_world(db, client)
    values = _populate(db, client, world, tmp_path / "storage")  # make_app's storage root
    erin = db.scalars(select(User).where(User.name == "erin")).one()
    _, secret = tokens_svc.issue(db=db, principal=Principal(user_id=erin.id, name="erin"), name="e")
    db.flush()
    headers = {"admin": world.h("admin"), "erin": auth(secret), "member": world.h("member")}
    doc = client.get("/openapi.json").json()
    lists = list_operations(doc)
    # the document finds them all: these at least (a new one joins by itself)
    assert {
        "/v1/jobs",
        "/v1/jobs/{job_id}/events",
        "/v1/teams",
        "/v1/teams/{team}/members",
        "/v1/cluster/hosts",
        "/v1/teams/{team}/artifacts",
        "/v1/webhooks",
        "/v1/webhooks/{hook_id}/deliveries",
        "/v1/sweeps",
        "/v1/sweeps/{sweep_id}/jobs",
        "/v1/qos",
        "/v1/tokens",
        "/v1/users",
    } <= set(lists)
    walked = []
    for path, op in sorted(lists.items()):
        if path in NOT_LISTS:
            continue
        schema = _resolve(doc, op["responses"]["200"]["content"]["application/json"]["schema"])
        assert schema.get("type") != "array", f"{path} answers a bare array: make it a page (items, next_cursor)"
        assert "next_cursor" in schema.get("properties", {}), f"{path}: its page has no next_cursor"
        params = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "query"}
        assert {"limit", "cursor"} <= set(params), f"{path}: no limit/cursor query parameters"
        assert "maximum" in _resolve(doc, params["limit"]["schema"]), f"{path}: limit has no maximum"
        url = path.format(**values)
        who = headers[READERS.get(path, "admin")]
        r = client.get(url, params={"limit": _resolve(doc, params["limit"]["schema"])["maximum"]}, headers=who)
        assert r.status_code == 200, (path, r.text)
        whole = [identity(i) for i in r.json()["items"]]
        assert len(set(whole)) == len(whole), f"{path}: items the identity fields do not tell apart"
        assert len(whole) >= 2, f"{path}: the test gave it too little to page ({len(whole)})"
        for limit in (1, 2):
            paged = walk(client, url, who, limit)
            assert paged == whole, f"{path} at limit={limit}: the pages are not the whole list, in order"
        walked.append(path)
        bad = client.get(url, params={"cursor": "not-a-cursor"}, headers=who)
        assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == "query.cursor", (path, bad.text)
    assert len(walked) >= 20, walked
