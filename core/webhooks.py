"""Webhooks, the part every process shares: which events notify, the deliveries the events deliverer
(``core.outbox``) writes for them, the signature and the bodies. The notifier (scheduler/live/notifier.py) runs
the deliverer and sends; core/services/webhooks.py manages hooks.

A hook hears the event kinds it asked for, of one job or of every job of its team:

| kind | the event |
|---|---|
| ``finished`` | the job SUCCEEDED |
| ``failed`` | the job FAILED |
| ``cancelled`` | the job was CANCELLED |
| ``preempted`` | the scheduler preempts it (PREEMPTING: checkpoint, then back in the queue) |
| ``restarted`` | it was LOST and is QUEUED again to restart from its last checkpoint |
| ``sla_violation`` | the SLA evaluator recorded a violation (``SLA_*``) |
| ``sweep_finished`` | the last job of a sweep ended (a team's hooks only): how many succeeded, failed, were
  cancelled or stopped early, and the best job by the sweep's objective |
| ``test`` | sent on request (``kiln webhooks test``) |
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Event, Job, Sweep, Team, Webhook, WebhookDelivery
from core.states import TERMINAL, JobState
from core.sweeps.ranking import objective_of, ranked, stopped_early, value_of
from core.webhook_kinds import SWEEP_KIND

ENDED = tuple(s.value for s in TERMINAL)
TEST_KIND = "test"
FORMATS = ("json", "slack")
SIGNATURE_HEADER = "Kiln-Signature"
# A receiver refuses a signature whose timestamp is further than this from its own clock (a replayed request).
SIGNATURE_TOLERANCE_S = 300

_BY_TYPE = {
    EventType.SUCCEEDED: "finished",
    EventType.FAILED: "failed",
    EventType.CANCELLED: "cancelled",
    EventType.PREEMPTING: "preempted",
}
_STATES = frozenset(s.value for s in JobState)


def may_notify(event_type: str) -> bool:
    """Whether some hook may hear an event of this type (``kind_of`` says which, from the whole event)."""
    return event_type in _BY_TYPE or event_type == EventType.QUEUED or event_type.startswith("SLA_")


def kind_of(event: Event) -> str | None:
    """The webhook kind of a job's event, or None when no hook hears it."""
    if event.job_id is None or not may_notify(event.type):
        return None
    if event.type in _BY_TYPE:
        return _BY_TYPE[EventType(event.type)]
    if event.type == EventType.QUEUED and (event.data or {}).get("from") == JobState.LOST:
        return "restarted"
    if event.type.startswith("SLA_"):
        return "sla_violation"
    return None


def enqueue_for_event(db: Session, event: Event) -> list[WebhookDelivery]:
    """Write one pending delivery per hook that hears ``event`` and has none for it yet (the events deliverer,
    ``core.outbox``, in its transaction; no commit). Events no hook can hear cost nothing; the others one indexed
    read of the team's hooks."""
    kind = kind_of(event)
    job = db.get(Job, event.job_id) if kind is not None and event.job_id is not None else None
    if kind is None or job is None:
        return []
    hooks = db.scalars(
        select(Webhook)
        .where(Webhook.team_id == job.team_id, or_(Webhook.job_id.is_(None), Webhook.job_id == job.id))
        .order_by(Webhook.id)
    ).all()
    out = _deliveries(db, [h for h in hooks if kind in (h.events or [])], kind, event, job)
    if job.sweep_id is not None and event.type in ENDED:
        out += _sweep_finished(db, [h for h in hooks if h.job_id is None and SWEEP_KIND in (h.events or [])], job)
    return out


def _deliveries(
    db: Session, hooks: list[Webhook], kind: str, event: Event, job: Job, extra: dict[str, Any] | None = None
) -> list[WebhookDelivery]:
    """A delivery of ``event`` to each of ``hooks`` that has none of this kind for it: the deliverer may read an
    event twice (``core.outbox``), and a sweep's end is found from its last job's end or from its close."""
    if not hooks:
        return []
    sent = set(
        db.scalars(
            select(WebhookDelivery.webhook_id).where(WebhookDelivery.event_id == event.id, WebhookDelivery.kind == kind)
        )
    )
    hooks = [h for h in hooks if h.id not in sent]
    if not hooks:
        return []
    team = db.get(Team, job.team_id)
    body = {**payload(kind, event, job, team.name if team is not None else ""), **(extra or {})}
    out = [
        WebhookDelivery(webhook_id=h.id, event=event, kind=kind, payload=body, created_at=event.created_at)
        for h in hooks
    ]
    db.add_all(out)
    return out


def _sweep_finished(db: Session, hooks: list[Webhook], job: Job) -> list[WebhookDelivery]:
    """``sweep_finished`` once every job of ``job``'s sweep has ended (and its search proposes no more)."""
    if not hooks:
        return []
    # The sweep's row serialises this with its search's close (``enqueue_for_closed_search``): of the two, the
    # second to take the lock finds the first's delivery and writes none.
    sweep = db.get(Sweep, job.sweep_id, with_for_update=True, populate_existing=True)
    if sweep is None:
        return []
    active = db.scalar(select(func.count()).select_from(Job).where(Job.sweep_id == sweep.id, Job.state.not_in(ENDED)))
    if active:
        return []
    if sweep.search is not None:  # an adaptive search with jobs still to propose has not finished
        submitted = db.scalar(select(func.count()).select_from(Job).where(Job.sweep_id == sweep.id)) or 0
        if sweep.jobs_to_come(submitted):
            return []
    return _sweep_deliveries(db, hooks, sweep)


def enqueue_for_closed_search(db: Session, sweep: Sweep) -> list[WebhookDelivery]:
    """``sweep_finished`` for an adaptive sweep whose search was closed before its count (a cancel, a proposal
    refused) once every one of its jobs had ended (``core.sweeps.service.close``, holding the sweep's row as the
    deliverer does, so exactly one of the two writes it): their last end heard of jobs still to come, so it sent
    nothing, and no end is left to send it."""
    hooks = [
        h
        for h in db.scalars(
            select(Webhook).where(Webhook.team_id == sweep.team_id, Webhook.job_id.is_(None)).order_by(Webhook.id)
        )
        if SWEEP_KIND in (h.events or [])
    ]
    return _sweep_deliveries(db, hooks, sweep) if hooks else []


def _sweep_deliveries(db: Session, hooks: list[Webhook], sweep: Sweep) -> list[WebhookDelivery]:
    """The sweep's summary, as the event of its last job's end (whichever end or close found it finished, the same
    event: one delivery per hook)."""
    event = db.scalar(
        select(Event)
        .join(Job, Job.id == Event.job_id)
        .where(Job.sweep_id == sweep.id, Event.type.in_(ENDED))
        .order_by(Event.id.desc())
        .limit(1)
    )
    last = None if event is None or event.job_id is None else db.get(Job, event.job_id, populate_existing=True)
    if event is None or last is None:
        return []
    return _deliveries(db, hooks, SWEEP_KIND, event, last, {"sweep": sweep_summary(db, sweep)})


def sweep_summary(db: Session, sweep: Sweep) -> dict[str, Any]:
    """How the sweep ended: its jobs by end, and its best job by its objective."""
    objective = objective_of(sweep)
    jobs = ranked(list(db.scalars(select(Job).where(Job.sweep_id == sweep.id))), objective)
    states = [j.state for j in jobs]
    best = jobs[0] if jobs else None
    value = None if best is None else value_of(best, objective)
    return {
        "id": sweep.id,
        "name": sweep.name,
        "jobs": len(jobs),
        "succeeded": states.count(JobState.SUCCEEDED),
        "failed": states.count(JobState.FAILED),
        "cancelled": states.count(JobState.CANCELLED),
        "stopped_early": sum(1 for j in jobs if stopped_early(j)),
        "objective": {"metric": objective.metric, "goal": objective.goal},
        "best": None if best is None or value is None else {"job_id": best.id, "name": best.name, "value": value},
    }


def payload(kind: str, event: Event, job: Job, team: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "event": {
            "type": event.type,
            "message": event.message,
            "created_at": event.created_at.isoformat() if event.created_at else None,
        },
        "job": {
            "id": job.id,
            "name": job.name,
            "team": team,
            # The state the event moved it to (the deliverer writes after it, when it may have moved on).
            "state": event.type if event.type in _STATES else job.state,
            "last_step": job.last_step,
            "last_loss": job.last_loss,
            "restart_count": job.restart_count,
            "exit_reason": job.exit_reason,
        },
    }


def body_bytes(fmt: str, delivery_id: int, payload: dict[str, Any]) -> bytes:
    """The request body: kiln's JSON (with the delivery's id, a receiver's idempotency key), or Slack's
    ``{"text": ...}`` for an incoming-webhook URL."""
    if fmt == "slack":
        return json.dumps({"text": slack_text(payload)}).encode()
    return json.dumps({"id": delivery_id, **payload}, separators=(",", ":"), sort_keys=True).encode()


def slack_text(payload: dict[str, Any]) -> str:
    if payload.get("kind") == SWEEP_KIND and isinstance(payload.get("sweep"), dict):
        sw, team = payload["sweep"], (payload.get("job") or {}).get("team")
        best = sw.get("best")
        metric = (sw.get("objective") or {}).get("metric", "loss")
        told = f"; best {metric} {best['value']:.4g} (job {best['job_id']} {best['name']})" if best else ""
        return (
            f"kiln: sweep {sw['id']} ({sw['name']}, team {team}) finished: {sw['succeeded']} succeeded, "
            f"{sw['failed']} failed, {sw['cancelled']} cancelled ({sw['stopped_early']} stopped early){told}"
        )
    job = payload.get("job") or {}
    event = payload.get("event") or {}
    head = f"kiln: job {job.get('id')} ({job.get('name')}, team {job.get('team')}) {payload.get('kind')}"
    message = event.get("message") or ""
    return f"{head}: {message}" if message else head


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the hook's secret>`` (Stripe's scheme): the
    timestamp is inside what is signed, so an old request cannot be replayed with a fresh one."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, now: float, tolerance_s: float = SIGNATURE_TOLERANCE_S) -> bool:
    """What a receiver does (docs/notifications.md has it to copy): the timestamp is recent and the MAC matches."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


def target_refusal(url: str, *, allow_private: bool) -> str | None:
    """Why kiln will not send to ``url``, or None. Checked when a hook is created and again before each delivery
    (a name may resolve elsewhere later); the delivery's own connection is checked again, on the address it
    connects to (``scheduler/live/egress.py``). A name is refused when any address it resolves to is
    (``address_refusal``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "the URL must be http:// or https:// with a host"
    if parts.username or parts.password:
        return "the URL must not carry a user name or password (the signature authenticates kiln)"
    if allow_private:
        return None
    _, why = checked_addresses(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    return why


def checked_addresses(host: str, port: int) -> tuple[list[str], str | None]:
    """The addresses ``host`` resolves to (each once, in the resolver's order), and why it is refused: it does not
    resolve, or any of them is not globally reachable (``address_refusal``); None when every one is."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        return [], f"the host {host!r} does not resolve"
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        why = address_refusal(address)
        if why is not None:
            return addresses, f"{host} resolves to {why} ({ALLOW_PRIVATE_HINT})"
    return addresses, None


ALLOW_PRIVATE_HINT = "KILN_WEBHOOK_ALLOW_PRIVATE_TARGETS allows targets that are not globally reachable"

# IPv6 forms that carry an IPv4 address: judged as that IPv4 (RFC 4291 mapped, RFC 6052 NAT64 well-known prefix,
# RFC 3056 6to4). The IPv4-compatible form (deprecated, ::/96), Teredo and the local-use NAT64 prefix (RFC 8215)
# are refused whatever they carry: nothing global is reached through them.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_IETF_ASSIGNMENTS = ipaddress.IPv4Network("192.0.0.0/24")  # anycast services and NAT64 discovery, never a receiver
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")


def address_refusal(address: str) -> str | None:
    """None for an address kiln may connect to, else the address and why not (``"127.0.0.1, a loopback
    address"``): every address that is not globally reachable (``ipaddress``'s ``is_global``), multicast ones,
    ``192.0.0.0/24``, and IPv4 written inside IPv6 judged as the IPv4 it is."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is no part of it
    except ValueError:
        return f"{address}, not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (_v4_in(ip) if ip in _NAT64 else None)
        if embedded is not None:
            why = _v4_refusal(embedded)
            return None if why is None else f"{address}, which carries {embedded}, {why}"
        if ip in _V4_COMPATIBLE and int(ip) > 1:
            return f"{address}, an IPv4-compatible IPv6 address (of {_v4_in(ip)})"
        if ip.teredo is not None:
            return f"{address}, a Teredo tunnel address (of {ip.teredo[1]})"
        if ip in _NAT64_LOCAL:
            return f"{address}, a local-use NAT64 address"
        why = _v6_refusal(ip)
    else:
        why = _v4_refusal(ip)
    return None if why is None else f"{address}, {why}"


def _v4_in(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)


def _v4_refusal(ip: ipaddress.IPv4Address) -> str | None:
    if ip.is_loopback:
        return "a loopback address"
    if ip in _THIS_NETWORK or ip.is_unspecified:
        return "an address of 'this network' (0.0.0.0/8)"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip in _IETF_ASSIGNMENTS:
        return "an IETF protocol assignment (192.0.0.0/24)"
    if ip.is_private:
        return "a private address"
    if not ip.is_global or ip.is_reserved:
        return "an address that is not globally reachable"
    return None


def _v6_refusal(ip: ipaddress.IPv6Address) -> str | None:
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_link_local or ip.is_site_local:
        return "a link-local or site-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "an address that is not globally reachable"
    return None
