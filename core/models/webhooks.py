"""Webhooks (per team, or per job) and their deliveries: one row per hook per event, written by the events
deliverer (``core.outbox``) after the event committed, at most once however often it reads the event."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from core.db import Base, utcnow
from core.models.jobs import Event


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), comment="NULL: every job of the team"
    )
    url: Mapped[str] = mapped_column(String(2048))
    # The HMAC key. Kept as written (the sender needs it to sign); the API shows it once, at creation.
    secret: Mapped[str] = mapped_column(String(128))
    events: Mapped[list[Any]] = mapped_column(comment="the event kinds it wants: finished, failed, ...")
    format: Mapped[str] = mapped_column(String(16), default="json")
    description: Mapped[str] = mapped_column(String(256), default="")
    created_by_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_webhooks_team_id_job_id", "team_id", "job_id"),
        CheckConstraint("format IN ('json', 'slack')", name="format_known"),
    )


class WebhookDelivery(Base):
    """A delivery and its log in one row: ``pending`` until the receiver answers 2xx (``delivered``) or the
    attempts run out (``failed``). A hook's deliveries go out in ``id`` order, one at a time."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    event_id: Mapped[int | None] = mapped_column(ForeignKey("events.id", ondelete="SET NULL"))
    kind: Mapped[str] = mapped_column(String(32), comment="finished, failed, preempted, ...")
    payload: Mapped[dict[str, Any]] = mapped_column(comment="the JSON body's content, fixed when enqueued")
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_attempt_at: Mapped[datetime | None] = mapped_column()
    last_status_code: Mapped[int | None] = mapped_column()
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column()

    event: Mapped[Event | None] = relationship()

    __table_args__ = (
        Index("ix_webhook_deliveries_webhook_id_status_id", "webhook_id", "status", "id"),
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
        # One delivery per hook, event and kind: the events deliverer may read an event twice (core.outbox).
        UniqueConstraint("webhook_id", "event_id", "kind"),
        CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status_known"),
    )
