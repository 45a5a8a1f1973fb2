"""Archives of a team's own code, stored by content (SHA-256) in the artifact store (docs/user-code.md)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base, utcnow


class Artifact(Base):
    """One uploaded archive of a team. The file is ``{storage}/artifacts/{team_id}/{digest}.tar.gz``."""

    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    digest: Mapped[str] = mapped_column(String(64), comment="SHA-256 of the archive, hex")
    bytes: Mapped[int] = mapped_column(BigInteger, comment="the archive's size, counted against the team's quota")
    unpacked_bytes: Mapped[int] = mapped_column(BigInteger)
    entries: Mapped[int] = mapped_column()
    uploaded_by_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime] = mapped_column(default=utcnow, comment="upload or the last submit naming it")

    __table_args__ = (UniqueConstraint("team_id", "digest"),)
