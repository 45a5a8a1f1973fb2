"""Webhooks on PostgreSQL: the API's rules, the deliveries the events deliverer writes from the events after its
cursor (once each, however a crash or a late commit makes it read them), and the notifier against a real HTTP
receiver (a server thread): signed, in order per hook, retried with backoff, given up at the limit."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_engine, utcnow
from core.migrate import upgrade
from core.models import Event, Job, QosClass, Team, Webhook, WebhookDelivery
from core.outbox import deliver_events
from core.settings import Settings
from core.states import JobState
from core.transitions import record_event, transition
from core.webhooks import SIGNATURE_HEADER, sign, verify
from harness.services import temporary_database
from scheduler.live.notifier import Notifier, backoff_s
from tests.support.api import World, build_world, make_app

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------------------------------------- the API


@pytest.fixture
def hooks_client(db: Session, pg_engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    app = make_app(pg_engine, tmp_path, db, webhook_allow_private_targets=True)
    with TestClient(app) as c:
        yield c


@pytest.fixture
def hooks_world(db: Session, hooks_client: TestClient) -> World:
    return build_world(db, hooks_client)


def test_secret_is_shown_once_and_hooks_list_without_it(hooks_client: TestClient, hooks_world: World) -> None:
    body = {"team": "alpha", "url": "http://127.0.0.1:9/kiln", "events": ["failed", "finished"]}
    r = hooks_client.post("/v1/webhooks", json=body, headers=hooks_world.h("team-admin"))
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["secret"].startswith("whsec_") and created["events"] == ["finished", "failed"]
    assert r.headers["Location"] == f"/v1/webhooks/{created['id']}"
    listed = hooks_client.get("/v1/webhooks?team=alpha", headers=hooks_world.h("team-admin")).json()["items"]
    assert [h["id"] for h in listed] == [created["id"]] and "secret" not in listed[0]
    one = hooks_client.get(f"/v1/webhooks/{created['id']}", headers=hooks_world.h("team-admin")).json()
    assert "secret" not in one
    assert hooks_client.delete(f"/v1/webhooks/{created['id']}", headers=hooks_world.h("team-admin")).status_code == 204
    assert hooks_client.get("/v1/webhooks", headers=hooks_world.h("team-admin")).json()["items"] == []


@pytest.mark.parametrize(
    ("role", "target", "status"),
    [
        ("member", {"team": "alpha"}, 403),  # a team's hooks are its team-admins'
        ("member", {"job": "alpha"}, 201),  # a job's, any member's
        ("viewer", {"job": "alpha"}, 403),
        ("beta-member", {"job": "alpha"}, 404),  # another team's job does not exist for them
        ("beta-member", {"team": "alpha"}, 404),
        ("admin", {"team": "beta"}, 201),
    ],
)
def test_who_may_create_which_hook(
    hooks_client: TestClient, hooks_world: World, role: str, target: dict[str, str], status: int
) -> None:
    body: dict[str, Any] = {"url": "http://127.0.0.1:9/kiln", "events": ["failed"]}
    if "team" in target:
        body["team"] = target["team"]
    else:
        body["job_id"] = hooks_world.jobs[target["job"]]
    r = hooks_client.post("/v1/webhooks", json=body, headers=hooks_world.h(role))
    assert r.status_code == status, r.text


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"team": "alpha", "url": "ftp://example.com/x", "events": ["failed"]}, "url"),
        ({"team": "alpha", "url": "http://127.0.0.1/x", "events": ["exploded"]}, "events"),
        ({"team": "alpha", "url": "http://u:p@127.0.0.1/x", "events": ["failed"]}, "url"),
        ({"url": "http://127.0.0.1/x", "events": ["failed"]}, "team"),
    ],
)
def test_bad_hooks_are_a_problem_naming_the_field(
    hooks_client: TestClient, hooks_world: World, body: dict[str, Any], loc: str
) -> None:
    r = hooks_client.post("/v1/webhooks", json=body, headers=hooks_world.h("team-admin"))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert any(loc in json.dumps(e.get("loc")) for e in r.json()["errors"]), r.json()


def test_private_targets_are_refused_unless_allowed(client: TestClient, world: World) -> None:
    """The default settings: a hook cannot point kiln at its own network (loopback here)."""
    body = {"team": "alpha", "url": "http://127.0.0.1:8421/v1/teams", "events": ["failed"]}
    r = client.post("/v1/webhooks", json=body, headers=world.h("team-admin"))
    assert r.status_code == 422 and "loopback" in r.text, r.text


def test_cancel_writes_the_delivery_from_its_event(hooks_client: TestClient, hooks_world: World, db: Session) -> None:
    alpha_job = hooks_world.jobs["alpha"]
    hook = hooks_client.post(
        "/v1/webhooks",
        json={"team": "alpha", "url": "http://127.0.0.1:9/k", "events": ["cancelled"]},
        headers=hooks_world.h("team-admin"),
    ).json()
    other = hooks_client.post(
        "/v1/webhooks",
        json={"team": "alpha", "url": "http://127.0.0.1:9/k", "events": ["finished"]},
        headers=hooks_world.h("team-admin"),
    ).json()
    assert hooks_client.post(f"/v1/jobs/{alpha_job}/cancel", headers=hooks_world.h("member")).status_code == 202
    assert db.scalars(select(WebhookDelivery.id)).all() == []  # the cancel wrote its event only
    deliver_events(db)
    rows = hooks_client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=hooks_world.h("team-admin")).json()[
        "items"
    ]
    assert [(d["kind"], d["status"], d["payload"]["job"]["id"]) for d in rows] == [("cancelled", "pending", alpha_job)]
    event = db.get(Event, db.get(WebhookDelivery, rows[0]["id"]).event_id)  # type: ignore[union-attr]
    assert event is not None and event.type == "CANCELLED" and event.job_id == alpha_job
    assert (
        hooks_client.get(f"/v1/webhooks/{other['id']}/deliveries", headers=hooks_world.h("team-admin")).json()["items"]
        == []
    )
    test = hooks_client.post(f"/v1/webhooks/{hook['id']}/test", headers=hooks_world.h("team-admin"))
    assert test.status_code == 202 and test.json()["kind"] == "test"


def test_a_sweep_tells_its_teams_hooks_once_its_last_job_ended(
    hooks_client: TestClient, hooks_world: World, db: Session
) -> None:
    from core.webhooks import slack_text
    from tests.support.api import spec

    h = hooks_world.h("team-admin")
    hook = hooks_client.post(
        "/v1/webhooks", json={"team": "alpha", "url": "http://127.0.0.1:9/k", "events": ["sweep_finished"]}, headers=h
    ).json()
    refused = hooks_client.post(
        "/v1/webhooks",
        json={"job_id": hooks_world.jobs["alpha"], "url": "http://127.0.0.1:9/k", "events": ["sweep_finished"]},
        headers=h,
    )
    assert refused.status_code == 422 and "team's hooks" in refused.text
    section = {
        "list": [{"lr": 0.1}, {"lr": 0.01}, {"lr": 0.001}],
        "objective": {"metric": "accuracy", "goal": "maximize"},
    }
    doc = {**spec(team="alpha", name="search"), "sweep": section}
    sweep = hooks_client.post("/v1/sweeps", json=doc, headers=hooks_world.h("member")).json()
    jobs = [db.get(Job, j["id"]) for j in sorted(sweep["jobs"], key=lambda j: j["id"])]

    def deliveries() -> list[dict[str, Any]]:
        deliver_events(db)
        return hooks_client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=h).json()["items"]

    for job, accuracy in zip(jobs[:2], (0.91, 0.97), strict=True):
        assert job is not None
        job.state = JobState.RUNNING.value
        job.eval_metrics = {"step": 10, "metrics": {"accuracy": accuracy}}
        transition(db, job, JobState.SUCCEEDED)
    db.flush()
    assert deliveries() == []  # one job still queued
    assert hooks_client.post(f"/v1/jobs/{jobs[2].id}/cancel", headers=hooks_world.h("member")).status_code == 202  # type: ignore[union-attr]
    (delivery,) = deliveries()
    assert delivery["kind"] == "sweep_finished" and delivery["payload"]["job"]["id"] == jobs[2].id  # type: ignore[union-attr]
    summary = delivery["payload"]["sweep"]
    assert (summary["id"], summary["jobs"], summary["succeeded"], summary["cancelled"]) == (sweep["id"], 3, 2, 1)
    assert summary["best"] == {"job_id": jobs[1].id, "name": "search-1", "value": 0.97}  # type: ignore[union-attr]
    text = slack_text(delivery["payload"])
    assert text.startswith(
        f"kiln: sweep {sweep['id']} (search, team alpha) finished: 2 succeeded, 0 failed, 1 cancelled"
    )
    assert text.endswith(f"best accuracy 0.97 (job {jobs[1].id} search-1)")  # type: ignore[union-attr]


def test_a_rolled_back_event_leaves_no_delivery(hooks_client: TestClient, hooks_world: World, db: Session) -> None:
    """The deliverer writes only for events that committed."""
    hooks_client.post(
        "/v1/webhooks",
        json={"team": "alpha", "url": "http://127.0.0.1:9/k", "events": ["failed"]},
        headers=hooks_world.h("team-admin"),
    )
    job = db.get(Job, hooks_world.jobs["alpha"])
    assert job is not None
    before = db.scalars(select(WebhookDelivery.id)).all()
    nested = db.begin_nested()
    transition(db, job, JobState.FAILED, message="boom")
    db.flush()
    assert db.scalars(select(WebhookDelivery.id)).all() == before  # the state machine writes the event only
    nested.rollback()
    deliver_events(db)
    assert db.scalars(select(WebhookDelivery.id)).all() == before


# --------------------------------------------------------------------------------------- the notifier


class Receiver:
    """A real HTTP server on a thread: answers each request with the next of ``statuses`` (then 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append((dict(self.headers), body))
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(b) for _, b in self.requests]


@pytest.fixture(scope="module")
def outbox_db() -> Iterator[sessionmaker[Session]]:
    """A database of its own: the notifier commits."""
    with temporary_database("kiln_webhooks") as url:
        upgrade(url)
        engine = make_engine(url)
        yield sessionmaker(bind=engine, expire_on_commit=False)
        engine.dispose()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def _hook_with_jobs(factory: sessionmaker[Session], url: str, n: int, fmt: str = "json") -> tuple[int, str, list[int]]:
    """A team with a hook on ``failed``, and ``n`` jobs that fail in order (one delivery each)."""
    with factory() as db:
        team = Team(name=f"t{time.monotonic_ns()}")
        db.add(team)
        db.flush()
        hook = Webhook(team_id=team.id, url=url, secret="whsec_test", events=["failed"], format=fmt)
        db.add(hook)
        qos = db.scalars(select(QosClass)).first()
        assert qos is not None
        ids = []
        for i in range(n):
            job = Job(name=f"j{i}", team_id=team.id, spec={}, qos_class_id=qos.id)
            db.add(job)
            db.flush()
            transition(db, job, JobState.FAILED, message=f"failure {i}")
            ids.append(job.id)
        db.commit()
        return hook.id, team.name, ids


def _deliveries(factory: sessionmaker[Session], hook_id: int) -> list[WebhookDelivery]:
    with factory() as db:
        return list(
            db.scalars(
                select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook_id).order_by(WebhookDelivery.id)
            ).all()
        )


def _make_due(factory: sessionmaker[Session], hook_id: int) -> None:
    """Time passes: the hook's waiting deliveries are due now (no test waits on the wall clock)."""
    with factory() as db:
        db.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.webhook_id == hook_id)
            .values(next_attempt_at=utcnow() - timedelta(seconds=1))
        )
        db.commit()


def _notifier(factory: sessionmaker[Session], **settings: Any) -> Notifier:
    return Notifier(settings=Settings(webhook_allow_private_targets=True, **settings), session_factory=factory)


def test_deliveries_are_signed_and_go_in_order(outbox_db: sessionmaker[Session], receiver: Receiver) -> None:
    hook_id, team, jobs = _hook_with_jobs(outbox_db, receiver.url, 3)
    assert _notifier(outbox_db).deliver_due() == 3
    assert [b["job"]["id"] for b in receiver.bodies()] == jobs
    for headers, body in receiver.requests:
        assert verify("whsec_test", headers[SIGNATURE_HEADER], body, time.time())
        assert not verify("whsec_test", headers[SIGNATURE_HEADER], body.replace(b"failure", b"success"), time.time())
        assert not verify("whsec_other", headers[SIGNATURE_HEADER], body, time.time())
        assert headers["Kiln-Event"] == "failed"
    first = receiver.bodies()[0]
    assert first["kind"] == "failed" and first["job"]["team"] == team and first["event"]["message"] == "failure 0"
    assert all(
        d.status == "delivered" and d.attempts == 1 and d.last_status_code == 200
        for d in _deliveries(outbox_db, hook_id)
    )


def test_a_replayed_signature_is_refused() -> None:
    body = b'{"id":1}'
    old = int(time.time()) - 3600
    assert not verify("s", sign("s", old, body), body, time.time())
    assert verify("s", sign("s", old, body), body, old + 10)


def test_a_failing_receiver_holds_the_hooks_later_deliveries(
    outbox_db: sessionmaker[Session], receiver: Receiver
) -> None:
    hook_id, _, jobs = _hook_with_jobs(outbox_db, receiver.url, 3)
    receiver.statuses = [503, 500]
    notifier = _notifier(outbox_db, webhook_backoff_base_s=60.0)
    assert notifier.deliver_due() == 1  # the head failed; the others wait behind it
    head, *rest = _deliveries(outbox_db, hook_id)
    assert (head.status, head.attempts, head.last_status_code) == ("pending", 1, 503)
    assert head.last_attempt_at is not None
    assert head.next_attempt_at - head.last_attempt_at == timedelta(seconds=60)
    assert all(d.attempts == 0 for d in rest)
    assert notifier.deliver_due() == 0  # not due yet
    _make_due(outbox_db, hook_id)
    assert notifier.deliver_due() == 1  # 500: the backoff doubles
    head = _deliveries(outbox_db, hook_id)[0]
    assert head.next_attempt_at - head.last_attempt_at == timedelta(seconds=120)  # type: ignore[operator]
    _make_due(outbox_db, hook_id)
    assert notifier.deliver_due() == 3
    assert [b["job"]["id"] for b in receiver.bodies()] == [jobs[0], jobs[0], jobs[0], jobs[1], jobs[2]]
    assert [d.status for d in _deliveries(outbox_db, hook_id)] == ["delivered"] * 3


def test_gives_up_at_the_limit_then_sends_the_next(outbox_db: sessionmaker[Session], receiver: Receiver) -> None:
    hook_id, _, jobs = _hook_with_jobs(outbox_db, receiver.url, 2)
    receiver.statuses = [500, 500]
    notifier = _notifier(outbox_db, webhook_max_attempts=2)
    notifier.deliver_due()
    _make_due(outbox_db, hook_id)
    notifier.deliver_due()
    first, second = _deliveries(outbox_db, hook_id)
    assert first.status == "failed" and first.attempts == 2 and "gave up after 2 attempts" in (first.last_error or "")
    assert second.status == "delivered"


def test_a_hook_locked_by_another_notifier_is_skipped(outbox_db: sessionmaker[Session], receiver: Receiver) -> None:
    """Two scheduler replicas never send one hook's deliveries at once."""
    hook_id, _, _ = _hook_with_jobs(outbox_db, receiver.url, 1)
    with outbox_db() as other:  # the notifier's lock (scheduler.live.notifier._lock_hook)
        other.scalars(select(Webhook).where(Webhook.id == hook_id).with_for_update(key_share=True)).one()
        assert _notifier(outbox_db).deliver_due() == 0
        other.rollback()
    assert _notifier(outbox_db).deliver_due() == 1


def test_slack_format_and_an_unreachable_receiver(outbox_db: sessionmaker[Session], receiver: Receiver) -> None:
    hook_id, team, jobs = _hook_with_jobs(outbox_db, receiver.url, 1, fmt="slack")
    _notifier(outbox_db).deliver_due()
    assert receiver.bodies() == [{"text": f"kiln: job {jobs[0]} (j0, team {team}) failed: failure 0"}]
    down_id, _, _ = _hook_with_jobs(outbox_db, "http://127.0.0.1:9/nothing-listens", 1)
    _notifier(outbox_db).deliver_due()
    (down,) = _deliveries(outbox_db, down_id)
    assert down.status == "pending" and down.last_status_code is None and "ConnectError" in (down.last_error or "")


def test_sla_violations_and_restarts_notify(outbox_db: sessionmaker[Session]) -> None:
    with outbox_db() as db:
        team = Team(name=f"s{time.monotonic_ns()}")
        db.add(team)
        db.flush()
        db.add(Webhook(team_id=team.id, url="http://127.0.0.1:9/", secret="s", events=["sla_violation", "restarted"]))
        qos = db.scalars(select(QosClass)).first()
        assert qos is not None
        job = Job(name="j", team_id=team.id, spec={}, qos_class_id=qos.id, state="RUNNING")
        db.add(job)
        db.flush()
        record_event(db, "SLA_STEP_TIME_VIOLATION", job=job, message="slow")
        record_event(db, "CHECKPOINT", job=job, message="not notified")
        transition(db, job, JobState.LOST, message="host died")
        transition(db, job, JobState.QUEUED, message="requeued")
        db.flush()
        deliver_events(db)
        kinds = db.scalars(
            select(WebhookDelivery.kind).join(Webhook).where(Webhook.team_id == team.id).order_by(WebhookDelivery.id)
        ).all()
        assert kinds == ["sla_violation", "restarted"]
        db.rollback()


def test_backoff_doubles_up_to_the_cap() -> None:
    s = Settings(webhook_backoff_base_s=5, webhook_backoff_max_s=60)
    assert [backoff_s(n, s) for n in (1, 2, 3, 4, 5, 6)] == [5, 10, 20, 40, 60, 60]


@pytest.mark.parametrize("commit_order", ["in id order", "against id order"])
def test_two_last_jobs_of_a_sweep_ending_at_once_tell_it_once(
    outbox_db: sessionmaker[Session], commit_order: str
) -> None:
    """Two transactions end a sweep's last two jobs at the same time: whichever end the deliverer reads first, and
    whether the other has committed by then or not, exactly one sweep_finished is written (its event is the sweep's
    last end, whichever end found the sweep finished)."""
    from core.models import Sweep

    with outbox_db() as db:
        team = Team(name=f"s{time.monotonic_ns()}")
        db.add(team)
        db.flush()
        hook = Webhook(team_id=team.id, url="http://127.0.0.1:9/k", secret="whsec_test", events=["sweep_finished"])
        sweep = Sweep(name="both", team_id=team.id, parameters={"list": [{"lr": 0.1}, {"lr": 0.2}]})
        db.add_all([hook, sweep])
        db.flush()
        qos = db.scalars(select(QosClass)).first()
        assert qos is not None
        jobs = [
            Job(
                name=f"both-{i}",
                team_id=team.id,
                spec={},
                qos_class_id=qos.id,
                sweep_id=sweep.id,
                state=JobState.RUNNING.value,
            )
            for i in range(2)
        ]
        db.add_all(jobs)
        db.commit()
        ids, hook_id = [j.id for j in jobs], hook.id

    ends = [outbox_db(), outbox_db()]
    for session, job_id in zip(ends, ids, strict=True):
        job = session.get(Job, job_id)
        assert job is not None
        transition(session, job, JobState.SUCCEEDED)
        session.flush()  # both ends in flight: neither waits for the other
    first, last = ends if commit_order == "in id order" else ends[::-1]
    first.commit()
    _read_events(outbox_db)  # one end read, the other not committed yet
    last.commit()
    _read_events(outbox_db)
    _read_events(outbox_db)
    for session in ends:
        session.close()
    (delivery,) = _deliveries(outbox_db, hook_id)
    assert delivery.kind == "sweep_finished" and delivery.payload["sweep"]["succeeded"] == 2


def _read_events(factory: sessionmaker[Session]) -> None:
    with factory() as db:
        deliver_events(db)
        db.commit()
