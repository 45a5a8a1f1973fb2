"""Jobs, their attempts, the event timeline, checkpoints and usage."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text, UniqueConstraint, false, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from core.db import Base, utcnow
from core.states import UNFINISHED, AttemptState, JobState

_UNFINISHED_SQL = text("state IN (" + ", ".join(f"'{s}'" for s in UNFINISHED) + ")")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    spec: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[str] = mapped_column(String(16), default=JobState.QUEUED.value)
    qos_class_id: Mapped[int] = mapped_column(ForeignKey("qos_classes.id"))
    priority: Mapped[int] = mapped_column(default=0)
    gpus: Mapped[int] = mapped_column(default=0)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    predicted_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, comment="peak GPU bytes per rank")
    pending_reason: Mapped[str | None] = mapped_column(String(32))
    pending_message: Mapped[str | None] = mapped_column(String(512))
    restart_count: Mapped[int] = mapped_column(default=0)
    not_before: Mapped[datetime | None] = mapped_column(comment="restart backoff")
    fencing_token: Mapped[int] = mapped_column(BigInteger, default=0, comment="the current attempt's token")
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    preempt_requested: Mapped[bool] = mapped_column(default=False)
    last_step: Mapped[int] = mapped_column(default=0)
    last_loss: Mapped[float | None] = mapped_column()
    exit_reason: Mapped[str | None] = mapped_column(String(512))
    # The team's own code (spec ``code.digest``): kept in a column so the artifact collector finds what is in use.
    code_digest: Mapped[str | None] = mapped_column(String(64))
    # The last evaluation of the team's code ({"step": N, "metrics": {name: value}}), shown by ls/describe.
    eval_metrics: Mapped[dict[str, Any] | None] = mapped_column()
    submitted_at: Mapped[datetime] = mapped_column(default=utcnow)
    admitted_at: Mapped[datetime | None] = mapped_column(comment="the latest admission")
    # Time in the queue, all waits counted (the first and every requeue): the queue-wait SLA's measure, kept by
    # ``core.transitions`` (``core.queue_wait`` reads it).
    queued_s: Mapped[float] = mapped_column(
        default=0.0, server_default=text("0"), comment="seconds queued in the waits that ended"
    )
    wait_started_at: Mapped[datetime | None] = mapped_column(
        comment="when the current wait after a requeue began (backoff excluded); NULL before the first admission"
    )
    # A hold (kiln hold): the scheduler leaves the job be until it is released; the wait is paused meanwhile (the
    # queue-wait SLA and the policy's backlog bound count only the time the job could have started).
    held_at: Mapped[datetime | None] = mapped_column(comment="held since (NULL: not held)")
    held_s: Mapped[float] = mapped_column(
        default=0.0, server_default=text("0"), comment="seconds held in the holds that ended"
    )
    held_by_admin: Mapped[bool] = mapped_column(
        default=False, server_default=false(), comment="the hold is a team admin's: only a team admin releases it"
    )
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), comment="the submission's Idempotency-Key")
    request_sha256: Mapped[str | None] = mapped_column(String(64), comment="the keyed submission's body, hashed")
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", order_by="Attempt.number", cascade="all, delete-orphan"
    )

    __table_args__ = (
        Index("ix_jobs_team_id_id", "team_id", "id"),
        Index("ix_jobs_state_id", "state", "id"),
        # every submission counts its team's unfinished jobs (the team's cap): only those rows, by team
        Index("ix_jobs_team_id_unfinished", "team_id", postgresql_where=_UNFINISHED_SQL, sqlite_where=_UNFINISHED_SQL),
        # /metrics and the SLA page read windows of recent submissions and admissions
        Index("ix_jobs_submitted_at", "submitted_at"),
        Index("ix_jobs_admitted_at", "admitted_at"),
        # a retried submission finds the job its key made (per team; NULL keys never clash)
        UniqueConstraint("team_id", "idempotency_key"),
        Index("ix_jobs_team_id_code_digest", "team_id", "code_digest"),
    )

    @property
    def time_limit_s(self) -> float | None:
        """The spec's time limit (seconds), None when it sets none."""
        return spec_time_limit(self.spec)

    def ran_s(self, now: datetime, *, besides: int | None = None) -> float:
        """Seconds its attempts have run (one still running: until ``now``), the attempt ``besides`` left out: the
        run time its time limit counts."""
        return sum(
            ((a.ended_at or now) - a.started_at).total_seconds()
            for a in self.attempts
            if a.started_at is not None and a.id != besides
        )


class JobDependency(Base):
    __tablename__ = "job_dependencies"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    depends_on_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    condition: Mapped[str] = mapped_column(
        String(16),
        default="afterok",
        server_default=text("'afterok'"),
        comment="afterok (the other succeeded), afterany (it ended), afternotok (it failed or was cancelled)",
    )


class Sweep(Base):
    """One submission expanded over a grid, a list or random draws of hyperparameters, or searched adaptively: its
    jobs share it (``jobs.sweep_id``)."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    parameters: Mapped[dict[str, Any]] = mapped_column(comment="the grid or list it expanded, as submitted")
    max_concurrent: Mapped[int | None] = mapped_column(comment="at most this many of its jobs run at once")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    search: Mapped[str | None] = mapped_column(String(16), comment="tpe: its next jobs are proposed as others end")
    closed_at: Mapped[datetime | None] = mapped_column(comment="its search proposes no more jobs since")
    closed_reason: Mapped[str | None] = mapped_column(String(512), comment="why its search proposes no more jobs")

    def jobs_to_come(self, jobs: int) -> int:
        """Jobs its search will still propose, with ``jobs`` submitted so far (0 for a sweep without a search)."""
        if self.search is None or self.closed_at is not None:
            return 0
        return max(0, int((self.parameters or {}).get("count") or 0) - jobs)


class Attempt(Base):
    """One run of a job on a placement. Only the attempt whose token equals ``jobs.fencing_token`` may act."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column()
    fencing_token: Mapped[int] = mapped_column(BigInteger)
    placement: Mapped[list[Any]] = mapped_column(comment="[{host, gpus: [uuid], slots}]")
    state: Mapped[str] = mapped_column(String(16), default=AttemptState.PENDING.value)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    first_step_at: Mapped[datetime | None] = mapped_column()
    resumed_from_step: Mapped[int | None] = mapped_column()
    ended_at: Mapped[datetime | None] = mapped_column()
    exit_code: Mapped[int | None] = mapped_column()
    exit_reason: Mapped[str | None] = mapped_column(String(512))

    job: Mapped[Job] = relationship(back_populates="attempts")

    __table_args__ = (UniqueConstraint("job_id", "number"), UniqueConstraint("job_id", "fencing_token"))


class Event(Base):
    """The timeline: every state transition, and audit records (``job_id`` NULL) for tokens and memberships."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    actor_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    type: Mapped[str] = mapped_column(String(48))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_events_job_id_id", "job_id", "id"),
        Index("ix_events_type_id", "type", "id"),  # counters by event type (/metrics, the SLA evaluator)
    )


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id", ondelete="SET NULL"))
    step: Mapped[int] = mapped_column()
    path: Mapped[str] = mapped_column(String(1024))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    verified: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("job_id", "step"),)


class Usage(Base):
    """GPU-seconds (CPU slot-seconds for CPU jobs) per team per attempt: the unit of account."""

    __tablename__ = "usage"

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), unique=True)
    gpu_type: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column()
    gpu_seconds: Mapped[float] = mapped_column(default=0.0)
    started_at: Mapped[datetime] = mapped_column()
    ended_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (Index("ix_usage_team_id_started_at", "team_id", "started_at"),)


class JobMetric(Base):
    """Training telemetry per step (rank 0), as relayed by the worker; the dashboard's and CLI's curves."""

    __tablename__ = "job_metrics"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id", ondelete="SET NULL"))
    step: Mapped[int] = mapped_column()
    ts: Mapped[datetime] = mapped_column(default=utcnow)
    loss: Mapped[float | None] = mapped_column()
    grad_norm: Mapped[float | None] = mapped_column()
    tokens_per_s: Mapped[float | None] = mapped_column()
    step_time_s: Mapped[float | None] = mapped_column()
    mfu: Mapped[float | None] = mapped_column()
    mem_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # Checkpoint I/O or a restore that overlapped the step: the step-time SLA compares steps without it.
    overhead: Mapped[str | None] = mapped_column(String(32), comment="kiln's own work during the step")
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict, comment="GPU samples, bandwidth, ...")

    __table_args__ = (Index("ix_job_metrics_job_id_step", "job_id", "step"),)


class CheckpointExport(Base):
    """A request to export a checkpoint's weights (safetensors + manifest), done by a worker (workers/exports.py);
    the files live in storage under ``exports/<job>/<step>/``."""

    __tablename__ = "checkpoint_exports"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column()
    state: Mapped[str] = mapped_column(String(16), default="requested", comment="requested, running, ready, failed")
    requested_by_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)
    claimed_by: Mapped[str | None] = mapped_column(String(128), comment="the worker converting it")
    claimed_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(String(1024))

    __table_args__ = (UniqueConstraint("job_id", "step"), Index("ix_checkpoint_exports_state_id", "state", "id"))


def spec_time_limit(spec: dict[str, Any] | None) -> float | None:
    """A stored spec's time limit (seconds), None when it sets none."""
    value = (spec or {}).get("time_limit_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None
