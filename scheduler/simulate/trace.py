"""The trace a replay runs: Philly-format jobs (or a generated Philly-like trace), each given a QoS class and a
team from its id."""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

CLASSES = {
    "gold": (1000, False, 1800.0),
    "silver": (500, False, 7200.0),
    "bronze": (200, True, 28800.0),
    "best-effort": (0, True, None),
}
TEAMS = 6
COHORT = "philly"


@dataclass(frozen=True)
class TraceJob:
    id: str
    gpus: int
    submit: float
    work: float  # the trace's runtime, seconds: failed attempts and the gaps between them are inside it
    attempts: int = 1  # scheduling attempts in the trace (informational: they are not replayed on top of work)


def qos_and_team(job_id: str) -> tuple[str, int]:
    digest = hashlib.sha256(job_id.encode()).digest()
    pct = digest[0] * 100 // 256
    qos = "gold" if pct < 15 else "silver" if pct < 45 else "bronze" if pct < 75 else "best-effort"
    return qos, digest[1] % TEAMS


def _parse_ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def load_trace(path: str, limit: int | None = None) -> list[TraceJob]:
    if path.startswith("synthetic:"):
        return synthetic_trace(int(path.split(":", 1)[1]))
    raw = json.loads(Path(path).read_text())
    jobs = [
        TraceJob(
            str(e["id"]),
            int(e["num_gpus"]),
            _parse_ts(e["submitted_time"]),
            float(e["runtime"]) * 60.0,
            max(1, len(e.get("attempts") or ())),
        )
        for e in raw
    ]
    jobs.sort(key=lambda j: (j.submit, j.id))
    if limit:
        jobs = jobs[:limit]
    t0 = jobs[0].submit if jobs else 0.0
    return [replace(j, submit=j.submit - t0) for j in jobs]


def synthetic_trace(n: int, *, seed: int = 7, load_gpus: float = 40.0) -> list[TraceJob]:
    """Philly-like: 4/8 GPU jobs mostly, some 16/32, heavy-tailed run times."""
    rng = random.Random(seed)
    sizes = [4] * 48 + [8] * 44 + [16] * 5 + [32] * 3
    mean_work = 4 * 3600.0
    mean_gpus = sum(sizes) / len(sizes)
    rate = load_gpus / (mean_gpus * mean_work)  # arrivals per second for the target average demand
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        work = min(rng.lognormvariate(math.log(mean_work) - 0.5, 1.0), 40 * 3600.0)
        out.append(TraceJob(f"synthetic_{i:05d}", rng.choice(sizes), t, max(600.0, work)))
    return out


def offered_load(trace: Sequence[TraceJob], gpus: int) -> float:
    """GPU time the trace asks for (its runtimes) over the GPU time of its submission window."""
    window = max((j.submit for j in trace), default=0.0)
    demand = sum(j.gpus * j.work for j in trace)
    return demand / (gpus * window) if window > 0 and gpus else 0.0
