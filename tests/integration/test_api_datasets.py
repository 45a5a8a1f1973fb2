"""Datasets over the API against PostgreSQL: a team-admin registers a directory of the storage root's data area,
members list it, a spec names it; what is not the team's, not a directory or not under the area is refused."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.support.api import World, spec

pytestmark = pytest.mark.integration

BASE = "/v1/teams/alpha/datasets"


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """The app's storage root (``make_app`` sets home = tmp_path) with alpha's data and a shared set."""
    root = tmp_path / "storage"
    (root / "datasets" / "alpha" / "digits-npz").mkdir(parents=True)
    (root / "datasets" / "alpha" / "digits-npz" / "part-0.npz").write_bytes(b"x")
    (root / "datasets" / "_shared" / "imagenet").mkdir(parents=True)
    (root / "datasets" / "beta" / "secret").mkdir(parents=True)
    (root / "checkpoints" / "7").mkdir(parents=True)
    return root


def _add(client: TestClient, world: World, role: str, name: str, path: str, team: str = "alpha") -> httpx.Response:
    return client.post(f"/v1/teams/{team}/datasets", json={"name": name, "path": path}, headers=world.h(role))


def test_register_list_get_delete(client: TestClient, world: World, storage: Path) -> None:
    r = client.post(
        BASE,
        json={"name": "digits-npz", "path": "./datasets/alpha//digits-npz/", "description": "digits as npz"},
        headers=world.h("team-admin"),
    )
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"{BASE}/digits-npz"
    body = r.json()
    assert body["path"] == "datasets/alpha/digits-npz" and body["available"] is True and body["problem"] is None
    assert _add(client, world, "team-admin", "imagenet", "datasets/_shared/imagenet").status_code == 201

    for role in ("member", "viewer", "team-admin", "admin"):
        listed = client.get(BASE, headers=world.h(role))
        assert listed.status_code == 200, listed.text
        assert [d["name"] for d in listed.json()["items"]] == ["digits-npz", "imagenet"]
    got = client.get(f"{BASE}/digits-npz", headers=world.h("viewer"))
    assert got.status_code == 200 and got.json()["description"] == "digits as npz"

    again = _add(client, world, "team-admin", "digits-npz", "datasets/alpha/digits-npz")
    assert again.status_code == 409

    # Gone from disk: still listed, not available, and why.
    os.rename(storage / "datasets" / "_shared" / "imagenet", storage / "datasets" / "_shared" / "moved")
    shown = client.get(f"{BASE}/imagenet", headers=world.h("member")).json()
    assert shown["available"] is False and "does not exist" in shown["problem"]

    assert client.delete(f"{BASE}/imagenet", headers=world.h("team-admin")).status_code == 204
    assert client.get(f"{BASE}/imagenet", headers=world.h("member")).status_code == 404
    assert client.delete(f"{BASE}/imagenet", headers=world.h("team-admin")).status_code == 404


def test_roles_and_other_teams(client: TestClient, world: World, storage: Path) -> None:
    for role in ("member", "viewer"):
        r = _add(client, world, role, "digits-npz", "datasets/alpha/digits-npz")
        assert r.status_code == 403, r.text
        assert r.headers["content-type"] == "application/problem+json"
    assert _add(client, world, "beta-member", "digits-npz", "datasets/alpha/digits-npz").status_code == 404
    assert _add(client, world, "team-admin", "digits-npz", "datasets/alpha/digits-npz").status_code == 201
    assert client.delete(f"{BASE}/digits-npz", headers=world.h("member")).status_code == 403
    assert client.get(BASE, headers=world.h("beta-member")).status_code == 404  # no existence leak
    assert client.get("/v1/teams/beta/datasets", headers=world.h("beta-member")).json()["items"] == []


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/etc", "is absolute"),
        (str(Path("/") / "tmp"), "is absolute"),
        ("datasets/alpha/../beta/secret", "contains '..'"),
        ("../../etc", "contains '..'"),
        ("checkpoints/7", "not in the data area"),
        ("datasets/beta/secret", "not in the data area"),  # another team's area
        ("datasets", "not in the data area"),
        ("datasets/alpha/nothing-here", "does not exist"),
        ("datasets/alpha/digits-npz/part-0.npz", "not a directory"),
        ("datasets/alpha/link-out", "leads out of"),
        ("datasets/alpha/link-to-checkpoints", "leads out of"),
    ],
)
def test_confinement(client: TestClient, world: World, storage: Path, tmp_path: Path, path: str, says: str) -> None:
    (storage / "datasets" / "alpha" / "link-out").symlink_to(tmp_path)
    (storage / "datasets" / "alpha" / "link-to-checkpoints").symlink_to(storage / "checkpoints" / "7")
    r = _add(client, world, "team-admin", "evil", path)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    (error,) = r.json()["errors"]
    assert error["loc"] == "path" and says in error["msg"], error
    assert client.get(BASE, headers=world.h("member")).json()["items"] == []


def test_a_link_inside_the_area_is_followed(client: TestClient, world: World, storage: Path) -> None:
    (storage / "datasets" / "alpha" / "latest").symlink_to(storage / "datasets" / "alpha" / "digits-npz")
    r = _add(client, world, "team-admin", "latest", "datasets/alpha/latest")
    assert r.status_code == 201, r.text


def test_bad_names_and_bodies_are_422(client: TestClient, world: World, storage: Path) -> None:
    for body in (
        {"name": "Bad Name", "path": "datasets/alpha/digits-npz"},
        {"name": "x"},
        {"name": "x", "path": "datasets/alpha/digits-npz", "host_path": "/etc"},
        {"name": "x", "path": "datasets/alpha\\digits-npz"},
    ):
        r = client.post(BASE, json=body, headers=world.h("team-admin"))
        assert r.status_code == 422, (body, r.text)


def test_a_spec_names_only_its_own_datasets_did_you_mean(client: TestClient, world: World, storage: Path) -> None:
    assert _add(client, world, "team-admin", "digits-npz", "datasets/alpha/digits-npz").status_code == 201
    typo = client.post("/v1/jobs", json=spec(name="typo", datasets=["digits-np"]), headers=world.h("member"))
    assert typo.status_code == 422, typo.text
    (error,) = typo.json()["errors"]
    assert error["loc"] == "datasets.0"
    assert "has no dataset 'digits-np'; did you mean 'digits-npz'?" in error["msg"]

    other = client.post(
        "/v1/jobs", json=spec(name="b", team="beta", datasets=["digits-npz"]), headers=world.h("beta-member")
    )
    assert other.status_code == 422 and other.json()["errors"][0]["loc"] == "datasets.0"  # alpha's, not beta's

    for bad in (["/etc/passwd"], ["../x"], ["digits-npz", "digits-npz"], {"digits-npz": "/etc"}):
        r = client.post("/v1/jobs", json=spec(name="bad", datasets=bad), headers=world.h("member"))
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["errors"][0]["loc"].startswith("datasets"), r.text

    ok = client.post("/v1/jobs", json=spec(name="reads", datasets=["digits-npz"]), headers=world.h("member"))
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["datasets"] == ["digits-npz"]
    overview = client.get(f"/v1/dashboard/jobs/{ok.json()['id']}", headers=world.h("viewer")).json()
    assert overview["datasets"] == [{"name": "digits-npz", "path": "datasets/alpha/digits-npz", "read_only": True}]

    # Named by an active job: not removed (its next attempt could not start).
    busy = client.delete(f"{BASE}/digits-npz", headers=world.h("team-admin"))
    assert busy.status_code == 409 and f"{ok.json()['id']} (QUEUED)" in busy.json()["detail"]
    assert client.post(f"/v1/jobs/{ok.json()['id']}/cancel", headers=world.h("member")).status_code in (200, 202)
    assert client.delete(f"{BASE}/digits-npz", headers=world.h("team-admin")).status_code == 204
