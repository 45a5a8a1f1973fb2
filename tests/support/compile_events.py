"""A job's attempts and the trainer's compile events as the worker's relay writes them (workers.telemetry_relay):
the compile-cache tests' world, the same in the service, API, CLI and browser tests.

Attempt 1 compiles cold and publishes; attempt 2 rejects a poisoned entry and compiles cold; attempt 3 hits the
team cache; attempt 4 is an older trainer's hit (source ``artifacts``, the key only in ``graph``, no ``saved_s``);
attempt 5 runs and has not compiled yet. Every rank reports its compile: rank 1's must not count twice.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Attempt, Job
from workers.telemetry_relay import RelayState, relay

KEY = "3f9a1c2e" + "7b" * 28  # a sha256 hex digest, as trainer.compile.cache_key makes
POISONED = "9d0e4b11" + "0c" * 28


def event(type_: str, rank: int = 0, **fields: Any) -> dict[str, Any]:
    """A trainer's telemetry record of an event (core.telemetry.Telemetry.event)."""
    return {"kind": "event", "type": type_, "message": type_.lower(), "fields": fields, "rank": rank}


def ok(rank: int = 0, **fields: Any) -> dict[str, Any]:
    return event("COMPILE_OK", rank, graph=f"whole:{KEY}", phases={}, **fields)


ATTEMPTS: list[list[dict[str, Any]]] = [
    [
        ok(cache_hit=False, cache_source=None, cache_key=KEY, load_s=0.0, elapsed_s=24.9, saved_s=None),
        ok(1, cache_hit=False, cache_source=None, cache_key=KEY, load_s=0.0, elapsed_s=25.1, saved_s=None),
        event("COMPILE_CACHE_PUBLISHED", cache_key=KEY),
    ],
    [
        event("COMPILE_CACHE_REJECTED", reason="numeric_mismatch", cache_key=POISONED, cache_source="team"),
        ok(cache_hit=False, cache_source=None, cache_key=KEY, load_s=0.2, elapsed_s=25.3, saved_s=None),
    ],
    [
        ok(cache_hit=True, cache_source="team", cache_key=KEY, load_s=0.3, elapsed_s=0.4, saved_s=21.3),
        ok(1, cache_hit=True, cache_source="team", cache_key=KEY, load_s=0.3, elapsed_s=0.5, saved_s=21.2),
    ],
    [ok(cache_hit=True, cache_source="artifacts", load_s=0.9, elapsed_s=5.2)],
    [],
]

# What kiln describe and the job page say of each attempt, and the team's figures over them.
SUMMARIES = [
    "miss (key 3f9a1c2e) 24.9 s, published",
    "miss (key 3f9a1c2e) 25.3 s; rejected 1 cache entry (team: numeric_mismatch)",
    "hit (team cache, key 3f9a1c2e) 0.4 s, saved 21.3 s",
    "hit (team cache, key 3f9a1c2e) 5.2 s",
    "not yet",
]
TEAM = {"compiled": 4, "hits": 2, "hit_rate": 0.5, "saved_s": 21.3, "rejected": 1}


def relay_compiles(session: Session, job: Job) -> list[Attempt]:
    """``job``'s five attempts, each with its compile events relayed; the caller commits."""
    now = utcnow()
    attempts = []
    for number, records in enumerate(ATTEMPTS, start=1):
        ended = number < len(ATTEMPTS)
        attempt = Attempt(
            job_id=job.id,
            number=number,
            fencing_token=number,
            placement=[{"host": "h1", "gpus": [], "slots": 1}],
            state="LOST" if ended else "RUNNING",
            started_at=now - timedelta(minutes=10 - number),
            ended_at=now - timedelta(minutes=9 - number) if ended else None,
        )
        session.add(attempt)
        session.flush()
        relay(session, job=job, attempt=attempt, records=records, state=RelayState())
        attempts.append(attempt)
    session.flush()
    return attempts
