"""What kiln forecast for a job, and what then happened: one row per job, kind and source."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base

_UNSETTLED = text("settled_at IS NULL")


class Forecast(Base):
    """The first forecast of its kind by its source, kept as made, with the measured value once the job tells it.

    Units by ``kind`` (``core.forecast_errors.KINDS``): ``start_time`` in seconds after ``made_at`` (the wait it
    foretold), ``peak_memory`` in bytes per rank, ``step_time`` in seconds, ``gpu_hours`` in GPU-hours."""

    __tablename__ = "forecasts"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16), comment="start_time, peak_memory, step_time, gpu_hours")
    source: Mapped[str] = mapped_column(String(16), comment="who forecast it: scheduler, submit, trainer, estimate")
    predicted: Mapped[float | None] = mapped_column(comment="NULL: kiln said it cannot be known (note says why)")
    predicted_high: Mapped[float | None] = mapped_column(comment="the top of a range (a start's latest)")
    actual: Mapped[float | None] = mapped_column(comment="as measured; NULL once settled: it never happened")
    note: Mapped[str | None] = mapped_column(String(512), comment="how it was forecast, or why it could not be")
    made_at: Mapped[datetime] = mapped_column()
    settled_at: Mapped[datetime | None] = mapped_column(comment="when the measured value became known")

    __table_args__ = (
        UniqueConstraint("job_id", "kind", "source"),
        # the scheduler's pass looks for the forecasts still waiting on their job, every cycle
        Index("ix_forecasts_unsettled", "job_id", postgresql_where=_UNSETTLED, sqlite_where=_UNSETTLED),
        Index("ix_forecasts_team_id_made_at", "team_id", "made_at"),
    )
