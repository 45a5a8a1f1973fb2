"""``kiln simulate --holdout``: the replay on parts of the trace the policy's defaults were not tuned on.

The defaults were chosen on the whole Philly trace at 40, 48 and 52 hosts (docs/scheduler-experiments.md). Held
out here: each half of the trace by submission time (the first 1,517 jobs and the last 1,517, each replayed alone
from an empty cluster, at the tuned sizes), and the whole trace at sizes never replayed while tuning. Every part is
replayed by kiln's policy (the live loop's settings) and EASY backfill, the best baseline that does not know run
times, under the same model; the table says kiln against EASY on each, whatever it shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

TUNED_SIZES = (40, 48, 52)
OTHER_SIZES = (36, 44, 56, 64)
POLICIES = ("easy", "kiln")


class _Submitted(Protocol):
    @property
    def submit(self) -> float: ...


J = TypeVar("J", bound=_Submitted)


@dataclass(frozen=True)
class Part:
    name: str  # "first half", "second half", "whole trace"
    hosts: int
    jobs: tuple[Any, ...]  # the trace's jobs of this part, submit times from the part's first job

    @property
    def key(self) -> str:
        return f"{self.name.replace(' ', '-')}_{self.hosts}"


def halves(jobs: Sequence[J]) -> tuple[list[J], list[J]]:
    """The trace split by submission time into two halves of as many jobs, each rebased to start at 0."""
    ordered = sorted(jobs, key=lambda j: j.submit)
    mid = len(ordered) // 2
    return _rebased(ordered[:mid]), _rebased(ordered[mid:])


def _rebased(jobs: list[J]) -> list[J]:
    t0 = jobs[0].submit if jobs else 0.0
    return [replace(j, submit=j.submit - t0) for j in jobs]  # type: ignore[type-var]


def parts(jobs: Sequence[J], tuned: Sequence[int] = TUNED_SIZES, other: Sequence[int] = OTHER_SIZES) -> list[Part]:
    """Each half at the tuned sizes, then the whole trace at the other sizes."""
    first, second = halves(jobs)
    out = [Part(name, n, tuple(half)) for name, half in (("first half", first), ("second half", second)) for n in tuned]
    return out + [Part("whole trace", n, tuple(jobs)) for n in other]


def compare(part: Part, offered_load: float, easy: dict[str, Any], kiln: dict[str, Any]) -> dict[str, Any]:
    """kiln against EASY on one part, from the replays' summaries (``replay.summarize``)."""
    cut = 1 - kiln["jct"]["mean_h"] / easy["jct"]["mean_h"] if easy["jct"]["mean_h"] else 0.0
    return {
        "part": part.name,
        "hosts": part.hosts,
        "jobs": len(part.jobs),
        "offered_load": round(offered_load, 3),
        "easy_mean_jct_h": easy["jct"]["mean_h"],
        "kiln_mean_jct_h": kiln["jct"]["mean_h"],
        "jct_cut_vs_easy": round(cut, 4),
        "easy_p95_jct_h": easy["jct"]["p95_h"],
        "kiln_p95_jct_h": kiln["jct"]["p95_h"],
        "util_makespan_gap_points": round(100 * (kiln["util_makespan"] - easy["util_makespan"]), 2),
        "kiln_gold_sla": kiln["sla_attainment"]["gold"]["attainment"],
        "kiln_preemptions_per_job": kiln["preemptions_per_job"],
        "kiln_lost_gpu_h": kiln["lost_gpu_h"],
        "jobs_killed_at_limit": {"easy": easy["jobs_killed_at_limit"], "kiln": kiln["jobs_killed_at_limit"]},
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| part | hosts | jobs | load | EASY mean JCT h | kiln mean JCT h | kiln vs EASY | EASY p95 h | kiln p95 h | "
        "util gap (points) | kiln gold SLA | kiln preemptions / job | killed at limit (EASY / kiln) |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        killed = r["jobs_killed_at_limit"]
        lines.append(
            f"| {r['part']} | {r['hosts']} | {r['jobs']} | {r['offered_load']:.2f} | {r['easy_mean_jct_h']:.1f} | "
            f"{r['kiln_mean_jct_h']:.1f} | {-100 * r['jct_cut_vs_easy']:+.1f}% | {r['easy_p95_jct_h']:.1f} | "
            f"{r['kiln_p95_jct_h']:.1f} | {r['util_makespan_gap_points']:+.2f} | {r['kiln_gold_sla']:.1%} | "
            f"{r['kiln_preemptions_per_job']:.3f} | {killed['easy']} / {killed['kiln']} |"
        )
    return "\n".join(lines)
