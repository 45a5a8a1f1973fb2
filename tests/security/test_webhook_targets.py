"""A webhook never makes kiln call into its own network: every address that is not globally reachable is refused,
in whatever form it is written, when the hook is created and on every connection a delivery makes, and a
delivery connects to the very address it checked.

Before: the filter read ``ipaddress``'s ``is_global`` of each resolved address only, so IPv4 inside IPv6 passed
(``[::127.0.0.1]``; NAT64 ``64:ff9b::7f00:1`` and ``64:ff9b:1::/48``; 6to4 ``2002:7f00:1::``), as did
``192.0.0.9`` (``192.0.0.0/24``), site-local ``fec0::/10`` and multicast; and a delivery checked the name, then
let httpx resolve it again to connect, so a name that answered a public address to the check and 127.0.0.1 to
the connection (DNS rebinding) reached a listener on the scheduler's own host. Now the notifier's transport
resolves once, refuses the whole name if any answer is not global, connects to the address it checked (the URL's
name stays in the Host header and the TLS SNI) and checks the peer of the new connection again.

DNS is the one part replaced here: this machine has no DNS server whose answers a test could change between two
lookups, so ``Resolver`` is a double of ``socket.getaddrinfo`` for names under ``.kiln.test`` (every other name,
and every address, resolves as usual)."""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_engine, utcnow
from core.migrate import upgrade
from core.models import Job, QosClass, Team, User, Webhook, WebhookDelivery
from core.services import webhooks as webhooks_svc
from core.services.errors import InvalidInput
from core.services.principal import Principal
from core.settings import Settings
from core.states import JobState
from core.transitions import transition
from core.webhooks import target_refusal
from harness.services import temporary_database
from scheduler.live.notifier import Notifier
from tests.support.api import World

pytestmark = pytest.mark.integration

# Addresses that are not globally reachable, as a hook's URL may spell them: the IPv4 they embed decides.
HOSTILE = {
    "v4-mapped loopback": "::ffff:127.0.0.1",
    "v4-mapped private": "::ffff:10.1.2.3",
    "v4-compatible loopback": "::127.0.0.1",
    "v4-compatible metadata": "::169.254.169.254",
    "NAT64 loopback": "64:ff9b::7f00:1",
    "NAT64 metadata": "64:ff9b::a9fe:a9fe",
    "local NAT64": "64:ff9b:1::a00:1",
    "6to4 loopback": "2002:7f00:1::1",
    "6to4 private": "2002:c0a8:101::1",
    "Teredo": "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "IETF protocol assignment": "192.0.0.9",
    "IETF protocol assignment .170": "192.0.0.170",
    "site-local": "fec0::1",
    "IPv4 multicast": "224.0.1.1",
    "IPv6 multicast": "ff0e::1",
    "this network": "0.1.2.3",
    "loopback as one decimal number": "2130706433",
    "loopback in hex": "0x7f.1",
    "loopback shortened": "127.1",
    "shared address space (CGNAT)": "100.64.0.1",
    "reserved": "240.0.0.1",
}
GLOBAL = {"IPv4": "8.8.8.8", "IPv6": "2001:4860:4860::8888", "NAT64 of a global": "64:ff9b::808:808"}


def _url(address: str, port: int = 9) -> str:
    return f"http://[{address}]:{port}/hook" if ":" in address else f"http://{address}:{port}/hook"


@pytest.mark.parametrize("address", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_address_forms_are_refused_when_a_hook_is_created(
    client: TestClient, world: World, address: str
) -> None:
    body = {"team": "alpha", "url": _url(address), "events": ["failed"]}
    r = client.post("/v1/webhooks", json=body, headers=world.h("team-admin"))
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == "url" and "KILN_WEBHOOK_ALLOW_PRIVATE_TARGETS" in r.text


@pytest.mark.parametrize("address", list(GLOBAL.values()), ids=list(GLOBAL))
def test_global_addresses_are_still_accepted(address: str) -> None:
    assert target_refusal(_url(address), allow_private=False) is None


# ------------------------------------------------------------------------------------------------ deliveries


class Listener:
    """An HTTP server on this host's loopback, recording every request it gets (none must come)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                listener.requests.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Resolver:
    """The DNS double: a lookup of a name under ``.kiln.test`` answers ``answers[n]`` for the n-th lookup (the last
    one again after that), as a rebinding name server with a TTL of 0 would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *answers: list[str]) -> None:
        self.lookups = 0
        real = socket.getaddrinfo

        def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0) -> Any:
            name = host.decode() if isinstance(host, bytes) else host
            if not (isinstance(name, str) and name.endswith(".kiln.test")):
                return real(host, port, family, type, proto, flags)
            addresses = answers[min(self.lookups, len(answers) - 1)]
            self.lookups += 1
            number = int(port or 0)
            return [
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, number, 0, 0))
                if ":" in a
                else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, number))
                for a in addresses
            ]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.server.shutdown()


@pytest.fixture(scope="module")
def outbox() -> Iterator[sessionmaker[Session]]:
    """A database of its own: the notifier commits."""
    with temporary_database("kiln_hook_targets") as url:
        upgrade(url)
        engine = make_engine(url)
        yield sessionmaker(bind=engine, expire_on_commit=False)
        engine.dispose()


def _admin(db: Session) -> Principal:
    user = db.scalars(select(User).where(User.name == "root")).first()
    if user is None:
        user = User(name="root", is_admin=True)
        db.add(user)
        db.flush()
    return Principal(user_id=user.id, name="root", user_is_admin=True, scopes=frozenset({"read", "write", "admin"}))


def _team(db: Session) -> Team:
    team = Team(name=f"t{secrets.token_hex(6)}")
    db.add(team)
    db.flush()
    return team


def _hook_and_failure(factory: sessionmaker[Session], url: str, *, check: bool = True) -> int:
    """A team with a hook on ``failed`` at ``url`` (created as the API creates one, unless ``check`` is False: a
    hook from before this fix, or from while private targets were allowed) and a job that fails: one delivery."""
    with factory() as db:
        team = _team(db)
        if check:
            hook_id = webhooks_svc.create(
                db=db, principal=_admin(db), team=team.name, job_id=None, url=url, events=["failed"]
            ).hook.id
        else:
            hook = Webhook(team_id=team.id, url=url, secret="whsec_test", events=["failed"], format="json")
            db.add(hook)
            db.flush()
            hook_id = hook.id
        qos = db.scalars(select(QosClass)).first()
        assert qos is not None
        job = Job(name="j", team_id=team.id, spec={}, qos_class_id=qos.id)
        db.add(job)
        db.flush()
        transition(db, job, JobState.FAILED, message="boom")
        db.commit()
        return hook_id


def _only_due(factory: sessionmaker[Session], hook_id: int) -> None:
    """The other tests' deliveries (retried after their backoff) wait: a round sends this hook's only."""
    with factory() as db:
        db.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.webhook_id != hook_id)
            .values(next_attempt_at=utcnow() + timedelta(days=1))
        )
        db.commit()


def _deliver(factory: sessionmaker[Session], hook_id: int, **settings: Any) -> WebhookDelivery:
    """One round of a notifier (private targets refused unless ``settings`` allow them); the hook's delivery."""
    _only_due(factory, hook_id)
    notifier = Notifier(settings=Settings(webhook_timeout_s=2.0, **settings), session_factory=factory)
    try:
        assert notifier.deliver_due() == 1
    finally:
        notifier.client.close()
    with factory() as db:
        (delivery,) = db.scalars(select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook_id)).all()
        return delivery


@pytest.mark.parametrize("address", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_address_forms_are_refused_at_delivery(
    outbox: sessionmaker[Session], listener: Listener, address: str
) -> None:
    hook_id = _hook_and_failure(outbox, _url(address, listener.port), check=False)
    delivery = _deliver(outbox, hook_id)
    assert delivery.status == "pending" and delivery.attempts == 1
    assert (delivery.last_error or "").startswith("refused"), delivery.last_error
    assert listener.requests == []


@pytest.mark.parametrize("public_lookups", [1, 2], ids=["rebinds-after-creation", "rebinds-after-the-check"])
def test_a_name_that_rebinds_to_loopback_never_reaches_this_host(
    outbox: sessionmaker[Session], listener: Listener, monkeypatch: pytest.MonkeyPatch, public_lookups: int
) -> None:
    """The name answers a public address to the first ``public_lookups`` lookups (the hook's creation, then the
    check before the delivery), then 127.0.0.1; the listener on 127.0.0.1 gets nothing."""
    resolver = Resolver(monkeypatch, *[["93.184.215.14"]] * public_lookups, ["127.0.0.1"])
    hook_id = _hook_and_failure(outbox, f"http://rebind.kiln.test:{listener.port}/hook")
    delivery = _deliver(outbox, hook_id)
    assert listener.requests == []
    assert (delivery.last_error or "").startswith("refused") and "127.0.0.1" in (delivery.last_error or "")
    assert delivery.status == "pending" and resolver.lookups >= 2


def test_a_name_answering_a_public_and_a_loopback_address_is_refused(
    outbox: sessionmaker[Session], listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    Resolver(monkeypatch, ["93.184.215.14", "127.0.0.1"])
    with outbox() as db, pytest.raises(InvalidInput, match="127.0.0.1"):
        webhooks_svc.create(
            db=db,
            principal=_admin(db),
            team=_team(db).name,
            job_id=None,
            url=f"http://both.kiln.test:{listener.port}/hook",
            events=["failed"],
        )
    hook_id = _hook_and_failure(outbox, f"http://both.kiln.test:{listener.port}/hook", check=False)
    delivery = _deliver(outbox, hook_id)
    assert listener.requests == [] and (delivery.last_error or "").startswith("refused")


def test_an_operator_who_allows_private_targets_still_reaches_a_local_receiver(
    outbox: sessionmaker[Session], listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KILN_WEBHOOK_ALLOW_PRIVATE_TARGETS=true keeps working, through a name too (Host header and all)."""
    Resolver(monkeypatch, ["127.0.0.1"])
    hook_id = _hook_and_failure(outbox, f"http://receiver.kiln.test:{listener.port}/hook", check=False)
    delivery = _deliver(outbox, hook_id, webhook_allow_private_targets=True)
    assert delivery.status == "delivered" and listener.requests == ["/hook"]
