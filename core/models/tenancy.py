"""Teams, users, roles, API tokens, QoS classes and SLA contracts."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Column, ForeignKey, Index, String, Table, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from core.db import Base, utcnow


class Role(enum.StrEnum):
    """Team roles; ``admin`` is the global role held on the user itself."""

    ADMIN = "admin"
    TEAM_ADMIN = "team-admin"
    MEMBER = "member"
    VIEWER = "viewer"


# The QoS classes a team may use: an admin's decision (a member cannot pick a class the team was not granted).
team_qos_classes = Table(
    "team_qos_classes",
    Base.metadata,
    Column("team_id", ForeignKey("teams.id", ondelete="CASCADE"), primary_key=True),
    Column("qos_class_id", ForeignKey("qos_classes.id", ondelete="CASCADE"), primary_key=True),
)


class Team(Base):
    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    cohort: Mapped[str | None] = mapped_column(String(64))
    fair_share_weight: Mapped[float] = mapped_column(default=1.0)
    gpu_hour_budget: Mapped[float | None] = mapped_column(comment="GPU-hours per budget period; NULL = none")
    budget_period_s: Mapped[int] = mapped_column(default=30 * 86400)
    restart_limit: Mapped[int] = mapped_column(
        default=10, server_default=text("10"), comment="the most restarts a contract of the team may ask for"
    )
    version: Mapped[int] = mapped_column(
        default=1, server_default=text("1"), comment="bumped by every change: the ETag of the team's settings"
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    unfinished_bound: Mapped[int | None] = mapped_column(
        comment="at least the team's unfinished jobs (PostgreSQL; NULL: unknown), so a submission checks the cap "
        "without counting them: core.repositories.submissions.insert_submitted"
    )

    quotas: Mapped[list[TeamQuota]] = relationship(back_populates="team", cascade="all, delete-orphan", lazy="selectin")
    qos_classes: Mapped[list[QosClass]] = relationship(
        secondary=team_qos_classes, lazy="selectin", order_by="desc(QosClass.priority)"
    )

    __table_args__ = (
        CheckConstraint("fair_share_weight > 0", name="weight_positive"),
        CheckConstraint("restart_limit >= 0", name="restart_limit_nonneg"),
    )


class TeamQuota(Base):
    """Kueue's vocabulary: nominal GPUs of one type, how much may be borrowed from the cohort and lent to it."""

    __tablename__ = "team_quotas"

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    gpu_type: Mapped[str] = mapped_column(String(64), comment="'*' = any type, 'cpu' = CPU slots")
    nominal: Mapped[int] = mapped_column(default=0)
    borrowing_limit: Mapped[int | None] = mapped_column(comment="NULL = unlimited within the cohort")
    lending_limit: Mapped[int | None] = mapped_column(comment="NULL = all unused nominal may be lent")

    team: Mapped[Team] = relationship(back_populates="quotas")

    __table_args__ = (
        UniqueConstraint("team_id", "gpu_type"),
        CheckConstraint("nominal >= 0", name="nominal_nonneg"),
    )


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    email: Mapped[str | None] = mapped_column(String(254))
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Who this user is at the OpenID provider; NULL for a local user (sign-in never takes one over by name).
    oidc_issuer: Mapped[str | None] = mapped_column(String(255))
    oidc_subject: Mapped[str | None] = mapped_column(String(255))

    __table_args__ = (UniqueConstraint("oidc_issuer", "oidc_subject"),)

    memberships: Mapped[list[Membership]] = relationship(
        back_populates="user", cascade="all, delete-orphan", lazy="selectin"
    )


class Membership(Base):
    __tablename__ = "memberships"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Granted by the provider's groups at sign-in: the next sign-in takes it away when the group is gone.
    from_sso: Mapped[bool] = mapped_column(default=False, server_default=text("false"))

    user: Mapped[User] = relationship(back_populates="memberships")
    team: Mapped[Team] = relationship(lazy="joined")

    __table_args__ = (
        UniqueConstraint("user_id", "team_id"),
        CheckConstraint("role IN ('team-admin', 'member', 'viewer')", name="role_known"),
    )


class TeamInvitation(Base):
    """A team-admin's invitation: the invited user joins only by accepting it (an admin adds members directly).
    Addressed by name, not by user id, so inviting reveals nothing about which user names exist."""

    __tablename__ = "team_invitations"

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    user_name: Mapped[str] = mapped_column(String(64), index=True)
    role: Mapped[str] = mapped_column(String(16))
    invited_by_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()

    team: Mapped[Team] = relationship(lazy="joined")

    __table_args__ = (
        UniqueConstraint("team_id", "user_name"),
        CheckConstraint("role IN ('team-admin', 'member', 'viewer')", name="role_known"),
    )


class ApiToken(Base):
    """Bearer tokens. Only the SHA-256 of the secret is stored; the prefix identifies it in listings."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]] = mapped_column(default=lambda: ["read", "write"])
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()
    last_used_at: Mapped[datetime | None] = mapped_column()
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="SET NULL"),
        index=True,
        comment="the token that minted this one: revoking it revokes this one",
    )

    user: Mapped[User] = relationship(lazy="joined")


class QosClass(Base):
    __tablename__ = "qos_classes"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(32), unique=True)
    priority: Mapped[int] = mapped_column(comment="higher runs first")
    preemptible: Mapped[bool] = mapped_column(default=False)
    gpu_memory_cap_bytes: Mapped[int | None] = mapped_column(BigInteger)
    sm_percent: Mapped[int] = mapped_column(default=100)
    pcie_bandwidth_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger)
    nvlink_bandwidth_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger)
    default_max_queue_wait_s: Mapped[float | None] = mapped_column()
    description: Mapped[str] = mapped_column(String(256), default="")

    __table_args__ = (CheckConstraint("sm_percent BETWEEN 1 AND 100", name="sm_percent_range"),)


class SlaContract(Base):
    """A team's default contract (``job_id`` NULL) or the effective contract of one job."""

    __tablename__ = "sla_contracts"

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    qos_class_id: Mapped[int] = mapped_column(ForeignKey("qos_classes.id"))
    max_queue_wait_s: Mapped[float | None] = mapped_column()
    deadline: Mapped[datetime | None] = mapped_column()
    max_restarts: Mapped[int] = mapped_column(default=3)
    recovery_time_objective_s: Mapped[float] = mapped_column(default=300.0)
    checkpoint_interval_s: Mapped[float] = mapped_column(default=600.0)
    min_checkpoint_success_rate: Mapped[float] = mapped_column(default=0.999)
    step_time_tolerance: Mapped[float] = mapped_column(default=1.3)
    version: Mapped[int] = mapped_column(
        default=1, server_default=text("1"), comment="bumped by every change: the ETag of the contract"
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    qos_class: Mapped[QosClass] = relationship(lazy="joined")

    __table_args__ = (
        Index("ix_sla_contracts_team_default", "team_id", "job_id"),
        CheckConstraint("max_restarts >= 0", name="max_restarts_nonneg"),
    )
