"""Hosts and their GPUs, as the worker's host agent registers them; the deployment they belong to."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from core.db import Base, utcnow
from core.states import HostState


class Host(Base):
    __tablename__ = "hosts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    queue: Mapped[str] = mapped_column(String(160), comment="the host's own Celery queue")
    address: Mapped[str | None] = mapped_column(String(256), comment="where other hosts reach it (rendezvous)")
    state: Mapped[str] = mapped_column(String(16), default=HostState.UP.value, comment=", ".join(HostState))
    cpu_slots: Mapped[int] = mapped_column(default=0, comment="training processes when it has no GPUs")
    excluded_until: Mapped[datetime | None] = mapped_column()
    exclusion_reason: Mapped[str | None] = mapped_column(String(256))
    links: Mapped[dict[str, Any]] = mapped_column(default=dict, comment="link capacities, bytes/s")
    mps: Mapped[str | None] = mapped_column(
        String(16), comment="its MPS daemon: running, restarting, failed; NULL: none (workers/mps.py)"
    )
    isolation: Mapped[str | None] = mapped_column(
        String(16),
        comment="sandbox, none (turned off), unavailable (runs kiln's own recipes only); NULL: not said yet",
    )
    isolation_note: Mapped[str | None] = mapped_column(String(512), comment="how, or why not, in words")
    last_heartbeat_at: Mapped[datetime | None] = mapped_column()
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)

    gpus: Mapped[list[GPU]] = relationship(
        back_populates="host", cascade="all, delete-orphan", lazy="selectin", order_by="GPU.index"
    )


class GPU(Base):
    __tablename__ = "gpus"

    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    index: Mapped[int] = mapped_column()
    model: Mapped[str] = mapped_column(String(128), comment="GPU type, e.g. H200")  # core.gpu_types
    name: Mapped[str | None] = mapped_column(String(128), comment="NVML's name")
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    mig_mode: Mapped[bool] = mapped_column(default=False)
    pcie_gen: Mapped[int | None] = mapped_column()
    nvlink_peers: Mapped[list[Any]] = mapped_column(default=list, comment="uuids reachable over NVLink")
    last_sample: Mapped[dict[str, Any]] = mapped_column(default=dict)
    healthy: Mapped[bool] = mapped_column(default=True)

    host: Mapped[Host] = relationship(back_populates="gpus")

    __table_args__ = (UniqueConstraint("host_id", "index"),)


class Deployment(Base):
    """This database's identity, one row written by migration 0009: host-wide directories that several kiln
    databases can share (a host's fast local checkpoint tier) are kept apart by it, and a storage directory is
    claimed by it (``core.deployment``), so a job never meets another database's job of the same number."""

    __tablename__ = "deployment"

    id: Mapped[int] = mapped_column(primary_key=True, comment="always 1: one row")
    uid: Mapped[str] = mapped_column(String(32), comment="random, hex")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SchedulerLease(Base):
    """Who leads the schedulers, until when: one row (``scheduler.live.leader``). A leader renews it every cycle
    on the database's clock; a standby takes it only once it expired, with the next term, so a frozen leader loses
    it after one lease whatever its connection does. Every cycle's transaction locks it and checks the term."""

    __tablename__ = "scheduler_lease"

    id: Mapped[int] = mapped_column(primary_key=True, comment="always 1: one row")
    holder: Mapped[str] = mapped_column(String(160), comment="host:pid:random of the leading process")
    term: Mapped[int] = mapped_column(BigInteger, comment="raised by one at each takeover")
    renewed_at: Mapped[datetime] = mapped_column()
    expires_at: Mapped[datetime] = mapped_column()
    watched_since: Mapped[datetime] = mapped_column(
        comment="since when some leader renewed without a gap: the reconciler's grace counts from it"
    )
