"""Uploading code is uploading files: an archive that would write outside its directory (``..``, absolute paths,
links out), holds devices, or is over a size limit or the team's quota is refused with problem+json, and nothing
is written anywhere but the artifact store. A team sees, downloads and runs only its own archives."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.code_archive import pack_bytes
from tests.support.api import World, build_world, make_app, spec

pytestmark = pytest.mark.integration

QUOTA = 4096
UPLOAD_LIMIT = 2048


@pytest.fixture
def small(db: Session, pg_engine: Engine, tmp_path: Path) -> Iterator[tuple[TestClient, World]]:
    app = make_app(
        pg_engine, tmp_path / "home", db, artifact_team_quota_bytes=QUOTA, artifact_max_upload_bytes=UPLOAD_LIMIT
    )
    with TestClient(app) as c:
        yield c, build_world(db, c)


def tarball(*members: tuple[str, bytes, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            data = b"print('pwned')\n" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def put(client: TestClient, team: str, blob: bytes, headers: dict[str, str], digest: str | None = None) -> object:
    digest = digest or hashlib.sha256(blob).hexdigest()
    return client.put(
        f"/v1/teams/{team}/artifacts/{digest}", content=blob, headers={**headers, "Content-Type": "application/gzip"}
    )


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


CRAFTED = {
    "traversal": ("../../../escaped.py", tarfile.REGTYPE, ""),
    "absolute": ("/tmp/kiln-absolute-escape.py", tarfile.REGTYPE, ""),
    "link-out": ("cfg", tarfile.SYMTYPE, "../../../../etc/passwd"),
    "link-absolute": ("cfg", tarfile.SYMTYPE, "/etc/passwd"),
    "hard-link": ("h", tarfile.LNKTYPE, "/etc/passwd"),
    "device": ("null", tarfile.CHRTYPE, ""),
    "fifo": ("pipe", tarfile.FIFOTYPE, ""),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_archive_is_refused_and_nothing_is_written(
    small: tuple[TestClient, World], tmp_path: Path, case: str
) -> None:
    client, world = small
    before = files_under(tmp_path)
    r = put(client, "alpha", tarball(("ok.py", tarfile.REGTYPE, ""), CRAFTED[case]), world.h("member"))
    assert r.status_code == 422, r.text  # type: ignore[attr-defined]
    assert r.headers["content-type"] == "application/problem+json"  # type: ignore[attr-defined]
    assert r.json()["errors"][0]["loc"] == "archive"  # type: ignore[attr-defined]
    assert files_under(tmp_path) == before  # not even the upload's temporary file is left
    assert not Path("/tmp/kiln-absolute-escape.py").exists()


def incompressible(i: int, size: int = 1000) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"weights{i}.bin")
        data = random.Random(i).randbytes(size)  # gzip cannot shrink it
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_limits_and_quota_are_refused_with_413(small: tuple[TestClient, World], tmp_path: Path) -> None:
    client, world = small
    store = tmp_path / "home" / "storage" / "artifacts"
    r = put(client, "alpha", incompressible(0, UPLOAD_LIMIT + 512), world.h("member"))
    assert r.status_code == 413 and "limit" in r.json()["detail"]  # type: ignore[attr-defined]
    sizes = []
    for i in range(1, 8):  # ~1.1 kB each, under the upload limit: the team's quota fills up after three
        blob = incompressible(i)
        r = put(client, "alpha", blob, world.h("member"))
        if r.status_code == 413:  # type: ignore[attr-defined]
            assert "quota" in r.json()["detail"]  # type: ignore[attr-defined]
            break
        assert r.status_code == 201, r.text  # type: ignore[attr-defined]
        sizes.append(len(blob))
    else:
        pytest.fail("the quota never refused")
    assert len(sizes) >= 2 and sum(sizes) <= QUOTA
    assert {p.stat().st_size for p in store.rglob("*.tar.gz")} == set(sizes)
    assert not any((store / "tmp").iterdir())
    # beta's quota is its own
    assert put(client, "beta", incompressible(99), world.h("beta-member")).status_code == 201  # type: ignore[attr-defined]
    mismatch = put(client, "alpha", incompressible(50), world.h("member"), digest="0" * 64)
    assert mismatch.status_code in (413, 422)  # type: ignore[attr-defined]


def test_only_the_team_sees_uploads_and_runs_its_code(small: tuple[TestClient, World], tmp_path: Path) -> None:
    client, world = small
    code = tmp_path / "code"
    code.mkdir()
    (code / "m.py").write_text("KILN_PROTOCOL = 1\n")
    blob, _ = pack_bytes(code)
    digest = hashlib.sha256(blob).hexdigest()
    assert put(client, "alpha", blob, world.h("viewer")).status_code == 403  # type: ignore[attr-defined]
    first = put(client, "alpha", blob, world.h("member"))
    assert first.status_code == 201 and first.json()["created"] is True  # type: ignore[attr-defined]
    again = put(client, "alpha", blob, world.h("member"))
    assert again.status_code == 200 and again.json()["created"] is False  # type: ignore[attr-defined]
    url = f"/v1/teams/alpha/artifacts/{digest}"
    assert client.get(url, headers=world.h("viewer")).status_code == 200
    assert client.get(f"{url}/archive", headers=world.h("viewer")).content == blob
    assert client.get(url, headers=world.h("beta-member")).status_code == 404
    assert client.get(f"{url}/archive", headers=world.h("beta-member")).status_code == 404

    job = spec(name="mine", code={"entry_point": "m", "digest": digest}, recipe={"name": "mine"})
    assert client.post("/v1/jobs", json=job, headers=world.h("member")).status_code == 201
    theirs = spec(name="theirs", team="beta", code={"entry_point": "m", "digest": digest}, recipe={"name": "x"})
    r = client.post("/v1/jobs", json=theirs, headers=world.h("beta-member"))
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "code.digest"
    unuploaded = spec(name="none", code={"entry_point": "m"}, recipe={"name": "x"})
    r = client.post("/v1/jobs", json=unuploaded, headers=world.h("member"))
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "code.digest"
