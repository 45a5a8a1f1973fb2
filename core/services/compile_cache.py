"""The compile cache's reuse, from the trainer's compile events: per attempt (``kiln describe``, the job page, the
attempts endpoint) and per team over a window (the cost page, ``kiln usage``, ``/metrics``).

The trainer reports each attempt's compile once per rank in ``COMPILE_OK`` (``cache_hit``, ``cache_source``,
``cache_key``, ``load_s``, ``elapsed_s``, ``saved_s``: seconds saved against the cold compile recorded with the
entry), an entry it refused in ``COMPILE_CACHE_REJECTED`` (``reason``, ``cache_key``) and one it wrote for the team in
``COMPILE_CACHE_PUBLISHED`` (``cache_key``). Older trainers' events lack some of these and are read as well as
they can be: no ``cache_key`` (taken from ``graph``, ``mode:key``), no ``saved_s`` (not shown),
``COMPILE_CACHE_INVALID`` for a rejection and the source ``artifacts`` (see ``SOURCE_NAMES``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from core.models import Attempt, Event, Job
from core.repositories import compile_cache as repo
from core.repositories import jobs as jobs_repo
from core.repositories import teams as teams_repo
from core.services.errors import NotFound
from core.services.principal import Principal

# Where a hit's compiled code came from. ``artifacts`` is an older trainer's name for a hit loaded from the
# portable artifacts in kiln's storage, which the team cache now holds: the same source, named as today.
SOURCE_NAMES = {"local": "local", "team": "team", "shared": "shared", "artifacts": "team"}
REASON_SHOWN = 80  # characters of a rejection's reason in the summary (the API's rejections carry it whole)
SHORT_KEY = 8  # hex digits of the key shown: enough to tell a team's few keys apart, as git's short hashes do


def source_name(raw: Any) -> str | None:
    return SOURCE_NAMES.get(str(raw), str(raw)) if raw else None


@dataclass(frozen=True)
class Rejection:
    reason: str
    key: str | None
    source: str | None = None  # the tier the refused entry came from (local, team, shared), where the event says

    @property
    def described(self) -> str:
        reason = _clip(self.reason, REASON_SHOWN)
        return f"{self.source}: {reason}" if self.source else reason


@dataclass(frozen=True)
class AttemptCompile:
    """One attempt's compile. ``status``: hit, miss, fallback (compiled, then fell back to eager), off (no compile:
    turned off, a script, or the attempt ended before compiling) or pending (it has not compiled yet)."""

    attempt: int
    status: str
    source: str | None = None
    key: str | None = None
    compile_s: float | None = None
    load_s: float | None = None
    saved_s: float | None = None
    published: bool = False
    rejections: tuple[Rejection, ...] = ()
    fallback: str | None = None

    @property
    def short_key(self) -> str | None:
        return self.key[:SHORT_KEY] if self.key else None

    @property
    def summary(self) -> str:
        """In words, as ``kiln describe`` and the job page show it: ``hit (team cache, key 3f9a1c2e) 0.4 s, saved
        21.3 s``."""
        key = f"key {self.short_key}" if self.key else "no key"
        took = f" {self.compile_s:.1f} s" if self.compile_s is not None else ""
        if self.status == "hit":
            text = f"hit ({self.source or 'unknown'} cache, {key}){took}"
            text += f", saved {self.saved_s:.1f} s" if self.saved_s is not None else ""
        elif self.status == "miss":
            text = f"miss ({key}){took}" + (", published" if self.published else "")
        elif self.status == "fallback":
            text = f"fell back to eager ({self.fallback}, {key}){took}"
        else:
            text = "not yet" if self.status == "pending" else "off"
        if self.rejections:
            n = len(self.rejections)
            reasons = "; ".join(r.described for r in self.rejections)
            text += f"; rejected {n} cache entr{'y' if n == 1 else 'ies'} ({reasons})"
        return text


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _key(data: Mapping[str, Any]) -> str | None:
    key = data.get("cache_key")
    if not key and isinstance(data.get("graph"), str) and ":" in data["graph"]:
        key = data["graph"].split(":", 1)[1]  # older trainers: graph is "mode:key"
    return str(key) if key else None


@dataclass
class _Seen:
    ok: Mapping[str, Any] | None = None
    fallback: tuple[str, Mapping[str, Any]] | None = None
    published: bool = False
    rejections: list[Rejection] = field(default_factory=list)


def _collect(events: Iterable[Event]) -> dict[int, _Seen]:
    """Rank 0's compile events of each attempt (``data.attempt``; the relay adds it and the rank)."""
    seen: dict[int, _Seen] = {}
    for e in events:
        data = e.data if isinstance(e.data, dict) else {}
        number = data.get("attempt")
        if not isinstance(number, int) or (data.get("rank") or 0) != 0:
            continue
        s = seen.setdefault(number, _Seen())
        if e.type == repo.COMPILE_OK and s.ok is None:
            s.ok = data
        elif e.type.startswith(repo.FALLBACK_PREFIX) and "graph" in data and s.fallback is None:
            s.fallback = (e.type, data)  # a compile's fallback names its graph; other fallbacks are not compiles'
        elif e.type == repo.PUBLISHED:
            s.published = True
        elif e.type in (repo.REJECTED, repo.INVALID):
            reason = str(data.get("reason") or "invalid")
            s.rejections.append(Rejection(reason, _key(data), source_name(data.get("cache_source"))))
    return seen


def _of_attempt(attempt: Attempt, s: _Seen, compile_off: bool) -> AttemptCompile:
    common: dict[str, Any] = {"attempt": attempt.number, "published": s.published, "rejections": tuple(s.rejections)}
    if s.ok is not None:
        hit = bool(s.ok.get("cache_hit"))
        return AttemptCompile(
            status="hit" if hit else "miss",
            source=source_name(s.ok.get("cache_source")) if hit else None,
            key=_key(s.ok),
            compile_s=_number(s.ok.get("elapsed_s")),
            load_s=_number(s.ok.get("load_s")),
            saved_s=_number(s.ok.get("saved_s")) if hit else None,
            **common,
        )
    if s.fallback is not None:
        reason, data = s.fallback
        return AttemptCompile(
            status="fallback", key=_key(data), compile_s=_number(data.get("elapsed_s")), fallback=reason, **common
        )
    pending = not compile_off and attempt.ended_at is None
    return AttemptCompile(status="pending" if pending else "off", **common)


def summarise(events: Iterable[Event], attempts: Sequence[Attempt], *, compile_off: bool) -> list[AttemptCompile]:
    """Each attempt's compile, from the job's events (any of them: those not about compiling are skipped)."""
    seen = _collect(events)
    return [_of_attempt(a, seen.get(a.number, _Seen()), compile_off) for a in attempts]


def compile_off(job: Job) -> bool:
    spec = job.spec or {}
    return bool(spec.get("command")) or (spec.get("compile") or {}).get("mode") == "off"


def for_attempts(
    db: Session, *, principal: Principal, job_id: int, attempts: Sequence[Attempt]
) -> list[AttemptCompile]:
    """``summarise`` for some of a job's attempts (a page of them), reading only its compile events."""
    job = jobs_repo.get(db, job_id)
    if job is None or not principal.can_see(job.team_id):
        raise NotFound(f"job {job_id} not found")
    return summarise(repo.job_events(db, job.id), attempts, compile_off=compile_off(job))


@dataclass(frozen=True)
class TeamReuse:
    """A team's compiles over a window: ``compiled`` attempts whose compile succeeded, ``hits`` of them from a cache,
    ``saved_s`` the seconds those hits saved (where the trainer said), ``rejected`` cache entries refused."""

    team: str
    compiled: int = 0
    hits: int = 0
    saved_s: float = 0.0
    rejected: int = 0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.compiled if self.compiled else None


def by_team(db: Session, *, teams: Mapping[int, str], since: datetime, until: datetime) -> dict[int, TeamReuse]:
    """Each of ``teams`` (id -> name; the caller has checked they may be seen), over [since, until)."""
    out = {team_id: TeamReuse(team=name) for team_id, name in teams.items()}
    for team_id, compiled, hits, saved, rejected in repo.reuse_by_team(
        db, team_ids=list(teams), since=since, until=until
    ):
        out[team_id] = TeamReuse(
            team=teams[team_id],
            compiled=int(compiled or 0),
            hits=int(hits or 0),
            saved_s=float(saved or 0.0),
            rejected=int(rejected or 0),
        )
    return out


def visible_by_team(db: Session, *, principal: Principal, since: datetime, until: datetime) -> list[TeamReuse]:
    """``by_team`` over the teams ``principal`` sees, those with any compile in the window only."""
    teams = {t.id: t.name for t in teams_repo.list_teams(db, principal.visible_team_ids())}
    reuse = by_team(db, teams=teams, since=since, until=until)
    return sorted((r for r in reuse.values() if r.compiled or r.rejected), key=lambda r: r.team)
