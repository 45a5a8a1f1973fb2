"""Revoking a token revokes every token minted from it, transitively: a token that leaked and minted a child before
it was revoked leaves no working child behind.

Before: a minted token kept no link to its parent; revoking the parent left the child (and the child's own
children) working until they expired, and an admin's token revoked left the tokens it minted for other users
working. Now each token knows the token that minted it (``api_tokens.parent_id``) and a revocation revokes the tree
below it, also against a mint racing the revocation (two real PostgreSQL transactions)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_engine
from core.migrate import upgrade
from core.models import ApiToken, User
from core.services import tokens as tokens_svc
from core.services.auth import authenticate
from core.services.errors import Unauthenticated
from core.services.principal import Principal
from harness.services import temporary_database
from tests.support.api import World, auth

pytestmark = pytest.mark.integration


def _mint(client: TestClient, secret: str, **body: object) -> dict[str, object]:
    r = client.post("/v1/tokens", json={"name": "child", **body}, headers=auth(secret))
    assert r.status_code == 201, r.text
    return dict(r.json())


def _works(client: TestClient, secret: object) -> bool:
    return client.get("/v1/me", headers=auth(str(secret))).status_code == 200


def test_revoking_a_token_revokes_what_it_minted_transitively(client: TestClient, world: World) -> None:
    parent = world.tokens["member"]
    child = _mint(client, parent)
    grandchild = _mint(client, str(child["secret"]))
    sibling = _mint(client, parent)
    nephew = _mint(client, str(sibling["secret"]))
    # Revoking the child takes the grandchild with it, and leaves its parent and the parent's other children.
    assert client.delete(f"/v1/tokens/{child['id']}", headers=auth(parent)).status_code == 200
    assert not _works(client, child["secret"]) and not _works(client, grandchild["secret"])
    assert _works(client, parent) and _works(client, sibling["secret"]) and _works(client, nephew["secret"])
    listed = {t["id"]: t for t in client.get("/v1/tokens", headers=auth(parent)).json()["items"]}
    assert listed[grandchild["id"]]["revoked_at"] is not None
    # Revoking the first token revokes everything below it.
    first = next(t["id"] for t in listed.values() if t["name"] == "test")
    assert client.delete(f"/v1/tokens/{first}", headers=auth(parent)).status_code == 200
    assert not any(_works(client, s) for s in (parent, sibling["secret"], nephew["secret"]))


def test_an_admins_token_revoked_takes_the_tokens_it_minted_for_others(client: TestClient, world: World) -> None:
    admin = world.tokens["admin"]
    for_member = _mint(client, admin, user="mark", scopes=["read"])
    for_itself = _mint(client, admin, scopes=["read", "write", "admin"])
    minted_by_that = _mint(client, str(for_itself["secret"]), user="vera", scopes=["read"])
    assert all(_works(client, t["secret"]) for t in (for_member, for_itself, minted_by_that))
    admin_token = client.get("/v1/tokens", headers=auth(admin)).json()["items"][0]["id"]
    assert client.delete(f"/v1/tokens/{admin_token}", headers=auth(str(for_itself["secret"]))).status_code == 200
    assert not any(_works(client, t["secret"]) for t in (for_member, for_itself, minted_by_that))
    assert _works(client, world.tokens["member"])  # the member's own token was never the admin's to mint


# ---------------------------------------------------------------------------------- a mint racing the revocation


@pytest.fixture(scope="module")
def committing() -> Iterator[sessionmaker[Session]]:
    """A database of its own: the two transactions below commit."""
    with temporary_database("kiln_revoke") as url:
        upgrade(url)
        engine = make_engine(url)
        yield sessionmaker(bind=engine, expire_on_commit=False)
        engine.dispose()


def _user_with_token(factory: sessionmaker[Session], name: str) -> tuple[int, str]:
    with factory() as db:
        user = User(name=name)
        db.add(user)
        db.flush()
        _, secret = tokens_svc.issue(db=db, principal=Principal(user_id=user.id, name=name), name="first")
        db.commit()
        return user.id, secret


def test_a_token_minted_while_its_ancestor_is_revoked_is_revoked_too(committing: sessionmaker[Session]) -> None:
    user_id, root = _user_with_token(committing, "racer")
    with committing() as db:
        _, middle = tokens_svc.issue(db=db, principal=authenticate(db=db, secret=root), name="middle")
        db.commit()
        root_id = authenticate(db=db, secret=root).token_id
        db.commit()
    assert root_id is not None
    owner = Principal(user_id=user_id, name="racer")
    minting = committing()
    new, _ = tokens_svc.issue(db=minting, principal=authenticate(db=minting, secret=middle), name="racing")
    minting.flush()  # the new token is written, not committed, when the revocation of the root starts

    done = threading.Event()

    def revoke() -> None:
        with committing() as db:
            tokens_svc.revoke(db=db, principal=owner, token_id=root_id)
            db.commit()
        done.set()

    thread = threading.Thread(target=revoke)
    thread.start()
    done.wait(1.0)
    minting.commit()
    minting.close()
    thread.join(10)
    assert done.is_set()
    with committing() as db:
        revoked = dict(db.execute(select(ApiToken.name, ApiToken.revoked_at).where(ApiToken.user_id == user_id)).all())
        assert all(at is not None for at in revoked.values()), revoked
        with pytest.raises(Unauthenticated):
            authenticate(db=db, secret=middle)
    assert new.id is not None


def test_a_token_is_not_minted_from_a_token_revoked_meanwhile(committing: sessionmaker[Session]) -> None:
    """The other order: the revocation commits between the minting request's authentication and its write."""
    user_id, root = _user_with_token(committing, "late")
    with committing() as db:
        principal = authenticate(db=db, secret=root)  # authenticated while still valid
        db.commit()
    assert principal.token_id is not None
    with committing() as db:
        tokens_svc.revoke(db=db, principal=Principal(user_id=user_id, name="late"), token_id=principal.token_id)
        db.commit()
    with committing() as db, pytest.raises(Unauthenticated):
        tokens_svc.issue(db=db, principal=principal, name="too-late")
