"""The webhook notifier: turns new events into deliveries (the events deliverer, core/outbox.py), then sends the
pending ones.

It runs as a thread of the scheduler process (``python -m scheduler``, which ``kiln up`` and docker-compose start
already), not in the scheduling loop: a receiver that answers slowly delays only its own hook, never a
scheduling cycle. Every scheduler replica runs one. On PostgreSQL a notifier sends a hook's deliveries only while
it holds that hook's row lock (``FOR UPDATE SKIP LOCKED``), so replicas share the hooks and never send one hook's
deliveries concurrently; the embedded default runs one scheduler.

Per hook, deliveries go out one at a time in ``id`` order: a delivery that fails is retried with exponential
backoff and the hook's later ones wait behind it, so a receiver that was down gets them later, in order. After
``webhook_max_attempts`` a delivery is marked ``failed`` and the next one goes. A crash between the receiver's
2xx and the commit sends that delivery again: receivers deduplicate on the ``Kiln-Delivery`` id (at least once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Webhook, WebhookDelivery
from core.outbox import deliver_events
from core.settings import Settings
from core.webhooks import SIGNATURE_HEADER, body_bytes, sign, target_refusal
from scheduler.live.egress import GuardedTransport, refusal_of
from scheduler.live.metrics import SchedulerMetrics

log = logging.getLogger(__name__)

USER_AGENT = "kiln-webhooks/1"
MAX_PER_HOOK_PER_ROUND = 100  # one busy hook does not starve the others
MAX_EVENT_PASSES_PER_ROUND = 10  # a backlog of events does not hold up the sends due


def backoff_s(attempts: int, settings: Settings) -> float:
    """The wait after the ``attempts``-th failure: base x 2^(attempts-1), at most ``webhook_backoff_max_s``."""
    return float(min(settings.webhook_backoff_base_s * 2 ** max(attempts - 1, 0), settings.webhook_backoff_max_s))


class Notifier:
    def __init__(
        self,
        *,
        settings: Settings,
        session_factory: Callable[[], Session],
        metrics: SchedulerMetrics | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.settings = settings
        self.session_factory = session_factory
        self.metrics = metrics
        # Connections go only where the target rules allow, to the address checked (scheduler/live/egress.py),
        # never through a proxy from the environment (it would resolve the name itself).
        self.client = client or httpx.Client(
            timeout=settings.webhook_timeout_s,
            follow_redirects=False,
            headers={"User-Agent": USER_AGENT},
            transport=GuardedTransport(allow_private=settings.webhook_allow_private_targets),
            trust_env=False,
        )

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                sent = self.deliver_due()
            except Exception:
                log.exception("notifier: a round failed; retrying")
                sent = 0
            if not sent:
                stop.wait(self.settings.webhook_poll_s)
        self.client.close()

    def deliver_due(self, now: datetime | None = None) -> int:
        """One round: the events written since the last round become deliveries, then every hook whose oldest
        pending delivery is due sends. Returns how many were attempted."""
        try:
            self.read_events()
        except Exception:  # what was pending still goes; the events are read again next round
            log.exception("notifier: reading new events failed; retrying next round")
        with self.session_factory() as db:
            hook_ids = due_hooks(db, now or utcnow())
            db.rollback()
        return sum(self._deliver_hook(hook_id) for hook_id in hook_ids)

    def read_events(self) -> int:
        """The events deliverer's passes (core/outbox.py), each in a transaction of its own, until the new events
        are read or a round's worth of passes is done; the deliveries written."""
        written = 0
        for _ in range(MAX_EVENT_PASSES_PER_ROUND):
            with self.session_factory() as db:
                done = deliver_events(db)
                db.commit()
            written += done.deliveries
            if not done.more:
                break
        return written

    def _deliver_hook(self, hook_id: int) -> int:
        attempted = 0
        while attempted < MAX_PER_HOOK_PER_ROUND:
            with self.session_factory() as db:
                hook = _lock_hook(db, hook_id)
                head = next_delivery(db, hook_id) if hook is not None else None
                if hook is None or head is None or head.next_attempt_at > utcnow():
                    db.rollback()
                    return attempted
                self._send(hook, head)
                waiting = head.status == "pending"
                db.commit()  # ends the lock; the next delivery takes it again
            attempted += 1
            if waiting:
                return attempted  # failed and waits for its backoff: the hook's later ones wait behind it
        return attempted

    def _send(self, hook: Webhook, delivery: WebhookDelivery) -> None:
        now = utcnow()
        delivery.attempts += 1
        delivery.last_attempt_at = now
        started = time.perf_counter()
        error, code = self._post(hook, delivery)
        if self.metrics is not None:
            self.metrics.webhook_seconds.observe(time.perf_counter() - started)
        delivery.last_status_code = code
        if error is None:
            delivery.status = "delivered"
            delivery.delivered_at = utcnow()
            delivery.last_error = None
        elif delivery.attempts >= self.settings.webhook_max_attempts:
            delivery.status = "failed"
            delivery.last_error = f"{error} (gave up after {delivery.attempts} attempts)"
        else:
            delivery.last_error = error
            delivery.next_attempt_at = now + timedelta(seconds=backoff_s(delivery.attempts, self.settings))
        if self.metrics is not None:
            outcome = "delivered" if error is None else ("failed" if delivery.status == "failed" else "retry")
            self.metrics.webhook_deliveries.labels(outcome).inc()
        log.info("webhook %s delivery %s (%s): %s", hook.id, delivery.id, delivery.kind, error or f"HTTP {code}")

    def _post(self, hook: Webhook, delivery: WebhookDelivery) -> tuple[str | None, int | None]:
        """(error or None, HTTP status or None)."""
        refusal = target_refusal(hook.url, allow_private=self.settings.webhook_allow_private_targets)
        if refusal is not None:
            return f"refused: {refusal}", None
        body = body_bytes(hook.format, delivery.id, delivery.payload)
        headers = {
            "Content-Type": "application/json",
            "Kiln-Event": delivery.kind,
            "Kiln-Delivery": str(delivery.id),
            SIGNATURE_HEADER: sign(hook.secret, int(time.time()), body),
        }
        try:
            response = self.client.post(hook.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            refused = refusal_of(exc)
            if refused is not None:
                return f"refused: {refused}"[:1000], None
            return f"{type(exc).__name__}: {exc}"[:1000], None
        if 200 <= response.status_code < 300:
            return None, response.status_code
        return f"HTTP {response.status_code}: {response.text[:200]}", response.status_code


def due_hooks(db: Session, now: datetime) -> list[int]:
    """Hooks whose oldest pending delivery is due (a later one never overtakes it)."""
    heads = (
        select(WebhookDelivery.webhook_id, func.min(WebhookDelivery.id).label("head"))
        .where(WebhookDelivery.status == "pending")
        .group_by(WebhookDelivery.webhook_id)
        .subquery()
    )
    stmt = (
        select(heads.c.webhook_id)
        .join(WebhookDelivery, WebhookDelivery.id == heads.c.head)
        .where(WebhookDelivery.next_attempt_at <= now)
        .order_by(heads.c.head)
    )
    return list(db.scalars(stmt).all())


def next_delivery(db: Session, hook_id: int) -> WebhookDelivery | None:
    return db.scalars(
        select(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == hook_id, WebhookDelivery.status == "pending")
        .order_by(WebhookDelivery.id)
        .limit(1)
    ).first()


def _lock_hook(db: Session, hook_id: int) -> Webhook | None:
    """The hook, locked for this transaction on PostgreSQL; None if it is gone or another notifier holds it. The
    lock (``FOR NO KEY UPDATE``) leaves the row to the events deliverer, whose new deliveries point at it: a slow
    receiver holds up only its own hook's sends."""
    stmt = select(Webhook).where(Webhook.id == hook_id)
    if db.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True, key_share=True)
    return db.scalars(stmt).first()
