"""What the dashboard shows of capacity: each team's quota used, borrowed and lent, its GPU-hours against budget
and its fair share; the hosts with the jobs on them; GPU-hours and cost over time."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from core.models import Host, Team
from core.repositories import dashboard as repo
from core.repositories import teams as teams_repo
from core.services.principal import Principal
from core.services.visibility import ACTIVE_STATES, visible_team_ids
from core.states import JobState

QUOTA_FIELDS = ("gpu_type", "nominal", "used", "borrowed", "lent", "borrowing_limit", "lending_limit")


def price_for(prices: Mapping[str, float], gpu_type: str | None) -> float:
    return prices.get(gpu_type or "*", prices.get("*", 0.0))  # usage rows carry the type the GPU registered


# ---------------------------------------------------------------------------------------------------------------
# Teams


@dataclass(frozen=True)
class TeamCapacity:
    team: Team
    weight_share: float
    usage_share: float
    gpu_hours: float
    quotas: list[dict[str, Any]]  # QUOTA_FIELDS
    waiting: int
    active: int


def _used_by_team_type(db: Session) -> dict[tuple[int, str], int]:
    """GPUs (CPU slots for CPU jobs) held by active jobs, by team and the quota's resource name."""
    used: dict[tuple[int, str], int] = defaultdict(int)
    for team_id, gpus, gpu_type, spec in repo.job_resources(db, ACTIVE_STATES):
        if gpus:
            used[(team_id, gpu_type or "*")] += gpus
        else:
            used[(team_id, "cpu")] += int(((spec or {}).get("resources") or {}).get("cpu_slots", 1))
    return used


def _quota_rows(db: Session, teams: Sequence[Team]) -> list[dict[str, Any]]:
    """Each team's quotas with what it uses, borrows and lends. Borrowing and lending are cohort-wide: what
    borrowers take beyond their nominal quota is lent by the cohort's teams with unused nominal quota, in
    proportion to what each can lend (its lending limit)."""
    used = _used_by_team_type(db)
    rows: list[dict[str, Any]] = []
    for t in teams:
        for q in t.quotas:
            u = used.get((t.id, q.gpu_type), 0)
            rows.append(
                {
                    "team_id": t.id,
                    "cohort": t.cohort or f"team:{t.id}",
                    "gpu_type": q.gpu_type,
                    "nominal": q.nominal,
                    "used": u,
                    "borrowed": max(0, u - q.nominal),
                    "borrowing_limit": q.borrowing_limit,
                    "lending_limit": q.lending_limit,
                    "lendable": min(max(0, q.nominal - u), q.lending_limit if q.lending_limit is not None else 10**9),
                    "lent": 0,
                }
            )
    by_pool: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_pool[(r["cohort"], r["gpu_type"])].append(r)
    for pool in by_pool.values():
        borrowed = sum(r["borrowed"] for r in pool)
        lendable = sum(r["lendable"] for r in pool)
        if borrowed and lendable:
            for r in pool:
                r["lent"] = round(min(r["lendable"], borrowed * r["lendable"] / lendable), 2)
    return rows


def _decayed_usage(db: Session, now: datetime, half_life_s: float) -> dict[int, float]:
    """GPU-seconds per team, each usage row's halved for every ``half_life_s`` since it ended."""
    decayed: dict[int, float] = defaultdict(float)
    for team_id, _, secs, _, end in repo.usage_overlapping(db, since=now - timedelta(seconds=4 * half_life_s)):
        age = (now - (end or now)).total_seconds()
        decayed[team_id] += secs * math.pow(0.5, age / half_life_s)
    return decayed


def _gpu_seconds_since(db: Session, since: datetime, now: datetime) -> dict[int, float]:
    """GPU-seconds per team within [since, now], counting only the part of each usage row inside the window."""
    out: dict[int, float] = defaultdict(float)
    for team_id, _, secs, start, end in repo.usage_overlapping(db, since=since):
        end = end or now
        span = max((end - start).total_seconds(), 1e-9)
        inside = max(0.0, (min(end, now) - max(start, since)).total_seconds())
        out[team_id] += secs * min(1.0, inside / span)
    return out


def team_capacity(db: Session, who: Principal, *, now: datetime, half_life_s: float) -> list[TeamCapacity]:
    """The teams in view; quotas, shares and lending are computed over every team (a cohort spans teams)."""
    visible = set(visible_team_ids(db, who))
    all_teams = teams_repo.list_teams(db, None)
    quota_rows = _quota_rows(db, all_teams)
    decayed = _decayed_usage(db, now, half_life_s)
    total_decayed = sum(decayed.values()) or 0.0
    total_weight = sum(t.fair_share_weight for t in all_teams) or 1.0
    out = []
    for t in all_teams:
        if t.id not in visible:
            continue
        period_usage = _gpu_seconds_since(db, now - timedelta(seconds=t.budget_period_s), now)
        out.append(
            TeamCapacity(
                team=t,
                weight_share=t.fair_share_weight / total_weight,
                usage_share=(decayed.get(t.id, 0.0) / total_decayed) if total_decayed else 0.0,
                gpu_hours=period_usage.get(t.id, 0.0) / 3600,
                quotas=[{k: r[k] for k in QUOTA_FIELDS} for r in quota_rows if r["team_id"] == t.id],
                waiting=repo.count_jobs(db, team_id=t.id, states=(JobState.QUEUED.value,)),
                active=repo.count_jobs(db, team_id=t.id, states=ACTIVE_STATES),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
# Cluster and cost


def hosts_with_jobs(db: Session, who: Principal) -> tuple[Sequence[Host], dict[str, list[dict[str, Any]]]]:
    """Every host, and the active jobs on each; hosts are shared infrastructure, so everyone signed in sees them,
    but a job's id and name only where its team is visible."""
    visible = set(visible_team_ids(db, who))
    running: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a, job in repo.current_attempts_of_jobs(db, ACTIVE_STATES):
        for p in a.placement or []:
            host = p.get("host") if isinstance(p, dict) else None
            if host:
                running[host].append(
                    {
                        "job_id": job.id if job.team_id in visible else None,
                        "name": job.name if job.team_id in visible else "(other team)",
                        "gpus": len(p.get("gpus") or []),
                        "slots": p.get("slots"),
                    }
                )
    return repo.hosts(db), running


@dataclass(frozen=True)
class TeamCost:
    team: str
    gpu_hours: float
    cost: float
    by_gpu_type: dict[str, float]
    points: list[tuple[int, float, float]]  # (bucket start, epoch seconds; GPU-hours; cost)


def cost_by_team(
    db: Session, who: Principal, *, prices: Mapping[str, float], now: datetime, since: datetime, step_s: int
) -> list[TeamCost]:
    """Each usage row's GPU-seconds spread evenly over its time span and cut into buckets of ``step_s``."""
    teams = visible_team_ids(db, who)
    team_names = teams_repo.names_by_id(db, teams)
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    by_type: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for team_id, gpu_type, secs, start, end in repo.usage_overlapping(db, since=since, team_ids=teams):
        end = end or now
        t0, t1 = max(start, since).timestamp(), min(end, now).timestamp()
        span = max((end - start).total_seconds(), 1e-9)
        price = price_for(prices, gpu_type)
        name = team_names.get(team_id, "?")
        b = int(t0) // step_s * step_s
        while b < t1:
            inside = max(0.0, min(t1, b + step_s) - max(t0, b))
            share = secs * min(1.0, inside / span) / 3600 if span > 0 else 0.0
            if share:
                cells[name][b][0] += share
                cells[name][b][1] += share * price
                by_type[name][gpu_type] += share
            b += step_s
    out = []
    for name in sorted(cells):
        buckets = sorted(cells[name].items())
        out.append(
            TeamCost(
                team=name,
                gpu_hours=sum(v[0] for _, v in buckets),
                cost=sum(v[1] for _, v in buckets),
                by_gpu_type=dict(by_type[name]),
                points=[(b, v[0], v[1]) for b, v in buckets],
            )
        )
    return out
