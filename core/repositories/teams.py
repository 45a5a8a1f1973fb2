"""Teams, quotas, memberships and team default SLA contracts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import String, and_, bindparam, func, or_, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from core.gpu_types import variants_pattern
from core.models import GPU, Host, Job, Membership, QosClass, SlaContract, Team, TeamInvitation, User, team_qos_classes


def get_by_name(db: Session, name: str) -> Team | None:
    return db.scalars(select(Team).where(Team.name == name)).one_or_none()


def id_by_name(db: Session, name: str) -> int | None:
    return db.scalar(select(Team.id).where(Team.name == name))


def all_ids(db: Session) -> list[int]:
    return list(db.scalars(select(Team.id)))


def submission_context(
    db: Session,
    *,
    team: str,
    qos: str | None,
    default_qos: str,
    terms: Sequence[str],
    gpu_type: str | None,
    lock: bool = False,
) -> Any:
    """Everything a submission reads, in one statement (it runs on every submission): the team's id and restart
    limit, its default contract's ``terms`` (NULL ``sla_id``: none) and that contract's QoS name, the QoS class the
    job gets -- ``qos`` if given, else the default contract's, else ``default_qos`` (NULL ``qos_id``: no such
    class) -- with its memory cap and whether the team may use it (``qos_allowed``), and what the cluster has of
    ``gpu_type`` (any type when None; a family name, its variants too): ``type_gpus`` usable GPUs, the largest with
    ``type_max_memory`` bytes, and ``cluster_hosts`` hosts with ``cluster_cpu_slots`` CPU slots in all. None when
    there is no such team.

    ``lock``: the team's row is held until the transaction ends (PostgreSQL; ``FOR NO KEY UPDATE``, which the
    foreign keys of other writes do not wait for): a submission counts the team's unfinished jobs after it, so two
    submissions of one team at once are counted one after the other (``jobs.insert_submitted``)."""
    conn = db.connection()
    if conn.dialect.name == "postgresql":  # the same statement as plain SQL: nothing to build or compile per call
        variants = variants_pattern(gpu_type) if gpu_type is not None else None
        params = {"team": team, "qos": qos, "default_qos": default_qos, "gpu_type": gpu_type, "variants": variants}
        return conn.exec_driver_sql(_submission_context_pg(tuple(terms), lock), params).first()
    t, s, tq = Team.__table__, SlaContract.__table__, team_qos_classes
    dq, q = QosClass.__table__.alias("default_qos"), QosClass.__table__.alias("qos")
    wanted = func.coalesce(bindparam("qos", qos, type_=String), dq.c.name, default_qos)
    g, h = GPU.__table__, Host.__table__
    variants = variants_pattern(gpu_type) if gpu_type is not None else None
    of_type = g.c.id.is_not(None) if gpu_type is None else g.c.model == gpu_type
    if variants is not None:  # a family name (H100) counts its variants too (H100-80GB): core.gpu_types.matches
        of_type = or_(of_type, g.c.model.regexp_match(variants))
    usable = and_(g.c.healthy, g.c.mig_mode.is_(False))  # what the scheduler places on (core.host_fit)
    stmt = (
        select(
            t.c.id.label("team_id"),
            t.c.restart_limit,
            s.c.id.label("sla_id"),
            *(s.c[k] for k in terms),
            dq.c.name.label("default_qos"),
            q.c.id.label("qos_id"),
            q.c.name.label("qos"),
            q.c.priority,
            q.c.gpu_memory_cap_bytes,
            tq.c.team_id.is_not(None).label("qos_allowed"),
            select(func.count()).select_from(g).where(of_type, usable).scalar_subquery().label("type_gpus"),
            select(func.max(g.c.memory_bytes)).where(of_type).scalar_subquery().label("type_max_memory"),
            select(func.count()).select_from(h).scalar_subquery().label("cluster_hosts"),
            select(func.coalesce(func.sum(h.c.cpu_slots), 0)).scalar_subquery().label("cluster_cpu_slots"),
        )
        .select_from(
            t.outerjoin(s, and_(s.c.team_id == t.c.id, s.c.job_id.is_(None)))
            .outerjoin(dq, dq.c.id == s.c.qos_class_id)
            .outerjoin(q, q.c.name == wanted)
            .outerjoin(tq, and_(tq.c.team_id == t.c.id, tq.c.qos_class_id == q.c.id))
        )
        .where(t.c.name == team)
        .limit(1)
    )
    return conn.execute(stmt).first()


@lru_cache(maxsize=8)
def _submission_context_pg(terms: tuple[str, ...], lock: bool = False) -> str:
    """``submission_context``'s statement for PostgreSQL (``terms`` are column names from code, never input)."""
    cols = "".join(f", s.{k}" for k in terms)
    of_type = (
        "(CAST(%(gpu_type)s AS VARCHAR) IS NULL OR g.model = %(gpu_type)s OR g.model ~ CAST(%(variants)s AS VARCHAR))"
    )
    return (
        f"SELECT t.id AS team_id, t.restart_limit, s.id AS sla_id{cols}, dq.name AS default_qos, q.id AS qos_id,"
        " q.name AS qos, q.priority, q.gpu_memory_cap_bytes, tq.team_id IS NOT NULL AS qos_allowed,"
        f" (SELECT count(*) FROM gpus AS g WHERE {of_type} AND g.healthy AND NOT g.mig_mode) AS type_gpus,"
        f" (SELECT max(g.memory_bytes) FROM gpus AS g WHERE {of_type}) AS type_max_memory,"
        " (SELECT count(*) FROM hosts) AS cluster_hosts,"
        " (SELECT coalesce(sum(cpu_slots), 0) FROM hosts) AS cluster_cpu_slots"
        " FROM teams AS t"
        " LEFT OUTER JOIN sla_contracts AS s ON s.team_id = t.id AND s.job_id IS NULL"
        " LEFT OUTER JOIN qos_classes AS dq ON dq.id = s.qos_class_id"
        " LEFT OUTER JOIN qos_classes AS q ON q.name = coalesce(CAST(%(qos)s AS VARCHAR), dq.name, %(default_qos)s)"
        " LEFT OUTER JOIN team_qos_classes AS tq ON tq.team_id = t.id AND tq.qos_class_id = q.id"
        " WHERE t.name = %(team)s LIMIT 1" + (" FOR NO KEY UPDATE OF t" if lock else "")
    )


def lock_for_submissions(db: Session, team_id: int, *, wait: bool = True) -> bool:
    """Hold the team's row as a submission does (``submission_context(lock=True)``); False when ``wait`` is False
    and another transaction holds it (PostgreSQL; elsewhere always True: SQLite writes one transaction at a
    time)."""
    if db.get_bind().dialect.name != "postgresql":
        return True
    skip = "" if wait else " SKIP LOCKED"
    found = db.execute(text(f"SELECT id FROM teams WHERE id = :id FOR NO KEY UPDATE{skip}"), {"id": team_id}).first()
    return found is not None


def bump_version(db: Session, row: Team | SlaContract, *, expected: int | None) -> bool:
    """Count one more change of ``row`` in the database, only if its version there is still ``expected`` (None:
    whatever it is), in one statement: two writers that read the same version cannot both win. False when it
    moved on; on success ``row.version`` is the new version."""
    model = type(row)
    stmt = update(model).where(model.id == row.id).values(version=model.version + 1).returning(model.version)
    if expected is not None:
        stmt = stmt.where(model.version == expected)
    version = db.execute(stmt.execution_options(synchronize_session=False)).scalar_one_or_none()
    if version is None:
        return False
    set_committed_value(row, "version", version)
    return True


def get_by_id(db: Session, team_id: int) -> Team | None:
    return db.get(Team, team_id)


def list_teams(db: Session, team_ids: Sequence[int] | None) -> Sequence[Team]:
    stmt = select(Team).order_by(Team.name)
    if team_ids is not None:
        stmt = stmt.where(Team.id.in_(team_ids))
    return db.scalars(stmt).all()


def names_by_id(db: Session, team_ids: Sequence[int]) -> dict[int, str]:
    if not team_ids:
        return {}
    return dict(db.execute(select(Team.id, Team.name).where(Team.id.in_(set(team_ids)))).tuples().all())


def has_jobs(db: Session, team_id: int) -> bool:
    return db.scalar(select(Job.id).where(Job.team_id == team_id).limit(1)) is not None


def get_membership(db: Session, *, team_id: int, user_id: int) -> Membership | None:
    return db.scalars(
        select(Membership).where(Membership.team_id == team_id, Membership.user_id == user_id)
    ).one_or_none()


def list_members(db: Session, team_id: int) -> Sequence[tuple[Membership, str]]:
    rows = db.execute(
        select(Membership, User.name)
        .join(User, User.id == Membership.user_id)
        .where(Membership.team_id == team_id)
        .order_by(User.name)
    )
    return rows.tuples().all()


def default_sla(db: Session, team_id: int) -> SlaContract | None:
    return db.scalars(
        select(SlaContract).where(SlaContract.team_id == team_id, SlaContract.job_id.is_(None)).limit(1)
    ).first()


def allowed_qos_names(db: Session, team_id: int) -> list[str]:
    rows = db.scalars(
        select(QosClass.name)
        .join(team_qos_classes, team_qos_classes.c.qos_class_id == QosClass.id)
        .where(team_qos_classes.c.team_id == team_id)
        .order_by(QosClass.priority.desc())
    )
    return list(rows)


def get_invitation(db: Session, *, team_id: int, user_name: str) -> TeamInvitation | None:
    return db.scalars(
        select(TeamInvitation).where(TeamInvitation.team_id == team_id, TeamInvitation.user_name == user_name)
    ).one_or_none()


def invitations_of_team(db: Session, team_id: int, now: datetime) -> Sequence[TeamInvitation]:
    return db.scalars(
        select(TeamInvitation)
        .where(TeamInvitation.team_id == team_id, TeamInvitation.expires_at > now)
        .order_by(TeamInvitation.user_name)
    ).all()


def invitations_for_user(db: Session, user_name: str, now: datetime) -> Sequence[TeamInvitation]:
    return db.scalars(
        select(TeamInvitation)
        .where(TeamInvitation.user_name == user_name, TeamInvitation.expires_at > now)
        .order_by(TeamInvitation.created_at)
    ).all()
