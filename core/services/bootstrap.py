"""The first admin: a user, a ``default`` team with a CPU quota, the admin's membership and a token; on a host
with GPUs, ``kiln up`` also gives the ``default`` team those GPUs."""

from __future__ import annotations

from sqlalchemy.orm import Session

from core.event_types import EventType
from core.gpu_types import ANY, CPU
from core.models import Membership, Role, SlaContract, Team, TeamQuota, User
from core.repositories import qos as qos_repo
from core.repositories import teams as teams_repo
from core.repositories import users as users_repo
from core.services.errors import Conflict
from core.services.principal import Principal
from core.services.tokens import issue
from core.transitions import record_event

DEFAULT_TEAM = "default"
DEFAULT_CPU_SLOTS = 4


def bootstrap_admin(*, db: Session, name: str, force: bool = False) -> tuple[User, str]:
    """Create (or, with ``force``, re-arm) the admin ``name``; returns (user, token secret). Does not commit.

    Refuses when an admin already exists unless ``force``: a second bootstrap must not mint tokens silently.
    """
    existing = users_repo.any_admin(db)
    if existing is not None and not force:
        raise Conflict(f"an admin already exists ({existing.name}); pass force to issue another admin token")
    user = users_repo.get_by_name(db, name)
    if user is None:
        user = User(name=name, is_admin=True)
        db.add(user)
    user.is_admin = True
    team = teams_repo.get_by_name(db, DEFAULT_TEAM)
    if team is None:
        # The first admin's own team may use every class (the examples use gold, silver and best-effort).
        team = Team(
            name=DEFAULT_TEAM,
            quotas=[TeamQuota(gpu_type="cpu", nominal=DEFAULT_CPU_SLOTS)],
            qos_classes=list(qos_repo.list_all(db)),
        )
        db.add(team)
        db.flush()
        silver = qos_repo.get_by_name(db, "silver")
        if silver is not None:
            db.add(SlaContract(team_id=team.id, job_id=None, qos_class_id=silver.id))
        record_event(db, EventType.TEAM_CREATED, team_id=team.id, message="default team (bootstrap)")
    db.flush()
    if teams_repo.get_membership(db, team_id=team.id, user_id=user.id) is None:
        db.add(Membership(user_id=user.id, team_id=team.id, role=Role.TEAM_ADMIN.value))
        record_event(
            db,
            EventType.MEMBER_ADDED,
            team_id=team.id,
            actor_user_id=user.id,
            message=f"{name} joined {DEFAULT_TEAM} as team-admin (bootstrap)",
            data={"user": name, "role": "team-admin"},
        )
    db.flush()
    principal = Principal(
        user_id=user.id, name=user.name, user_is_admin=True, scopes=frozenset({"read", "write", "admin"})
    )
    # No cap on live tokens here: the operator re-arming the first admin must never be locked out.
    _, secret = issue(db=db, principal=principal, name="bootstrap", scopes=("read", "write", "admin"))
    return user, secret


def give_default_team_gpus(*, db: Session, gpus_by_type: dict[str, int]) -> list[str]:
    """One quota for the ``default`` team that covers every GPU type (``*``, nominal = the local host's GPU count),
    so the embedded default trains on the GPUs it found whether a job names their type or not: a job without
    ``gpu_type`` (most small and fractional ones) draws on ``*``, and a typed quota alone would leave it
    waiting for ever. Nothing is added once the team has any GPU quota: a quota an admin set is never widened.
    Returns what was added, e.g. ``["*=1"]``. Does not commit."""
    team = teams_repo.get_by_name(db, DEFAULT_TEAM)
    count = sum(n for n in gpus_by_type.values() if n > 0)
    if team is None or count == 0 or any(q.gpu_type != CPU for q in team.quotas):
        return []
    team.quotas.append(TeamQuota(gpu_type=ANY, nominal=count))
    added = [f"{ANY}={count}"]
    found = ", ".join(f"{n} x {t}" for t, n in sorted(gpus_by_type.items()))
    record_event(
        db,
        EventType.TEAM_UPDATED,
        team_id=team.id,
        message=f"default team: the local host's GPUs ({found})",
        data={"added": added},
    )
    teams_repo.bump_version(db, team, expected=None)  # a change of its settings: a new ETag
    db.flush()
    return added
