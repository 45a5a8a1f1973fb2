"""A team's registered datasets: names for directories of the storage root's data area (docs/user-code.md)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base, utcnow


class Dataset(Base):
    """``name`` of team ``team_id`` is the directory ``{storage}/{path}`` (``core.datasets`` says where it may be)."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(1024), comment="relative to the storage root, under datasets/")
    description: Mapped[str | None] = mapped_column(String(256))
    created_by_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("team_id", "name"),)
