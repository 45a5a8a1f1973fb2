"""A replay's figures: each result summarised (JCT, waits, utilisation, SLA attainment, preemptions, lost GPU
time), the targets checked against the baselines, per draw of the users' limits, as tables and plots."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from scheduler.simulate.jobs import Result
from scheduler.simulate.trace import CLASSES


def window_utilisation(r: Result) -> float:
    """Time-averaged busy fraction over the submission window (the series is a step function)."""
    if r.window <= 0 or not r.series:
        return 0.0
    area = 0.0
    for (t, _q, busy), (t_next, _q2, _b2) in zip(r.series, [*r.series[1:], (r.window, 0, 0)], strict=True):
        lo, hi = min(t, r.window), min(t_next, r.window)
        if hi > lo:
            area += busy * (hi - lo)
    return area / (r.gpus * r.window)


def idle_while_queued_gpu_h(r: Result) -> float:
    idle = 0.0
    for (t, queued, busy), (t_next, _q, _b) in zip(r.series, [*r.series[1:], (r.makespan, 0, 0)], strict=True):
        if queued:
            idle += (r.gpus - busy) * max(0.0, t_next - t)
    return idle / 3600


def summarize(r: Result) -> dict[str, Any]:
    done = [j for j in r.jobs if j.finish is not None]
    jct = [j.finish - j.submitted_at for j in done]  # type: ignore[operator]
    wait = [j.queued_s for j in done]

    def stats(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {"mean_h": 0.0, "p50_h": 0.0, "p95_h": 0.0}
        s = sorted(xs)
        return {
            "mean_h": round(statistics.fmean(s) / 3600, 3),
            "p50_h": round(s[len(s) // 2] / 3600, 3),
            "p95_h": round(s[min(len(s) - 1, int(0.95 * len(s)))] / 3600, 3),
        }

    sla: dict[str, dict[str, Any]] = {}
    for qos, (_p, _pre, max_wait) in CLASSES.items():
        js = [j for j in r.jobs if j.sub.qos == qos]
        met = sum(1 for j in js if j.finish is not None and (max_wait is None or j.queued_s <= max_wait))
        sla[qos] = {
            "jobs": len(js),
            "attainment": round(met / len(js), 4) if js else 1.0,
            "mean_wait_h": round(statistics.fmean([j.queued_s for j in js]) / 3600, 3) if js else 0.0,
            "missed_by_reason": dict(sorted(Counter(j.miss_reason for j in js if j.miss_reason).items())),
        }
    plans = sorted(r.plan_s)
    return {
        "policy": r.name,
        "oracle": r.oracle,
        "jobs_finished": len(done),
        "jobs_total": len(r.jobs),
        "jobs_failed": sum(1 for j in r.jobs if j.failed),
        "limits": r.limits,
        # Killed at a limit below their run time and resubmitted (the underestimating model): their runs are lost.
        "jobs_killed_at_limit": sum(1 for j in r.jobs if j.kills),
        "kills_at_limit": sum(j.kills for j in r.jobs),
        "jct": stats(jct),
        "wait": stats(wait),
        "util_makespan": round(r.work_gpu_s / (r.gpus * r.makespan), 4) if r.makespan else 0.0,
        "busy_window": round(window_utilisation(r), 4),
        "makespan_days": round(r.makespan / 86400, 2),
        "idle_while_queued_gpu_h": round(idle_while_queued_gpu_h(r)),
        "sla_attainment": sla,
        "preemptions": r.preemptions,
        "preemptions_per_job": round(r.preemptions / max(1, len(r.jobs)), 3),
        "reclaim_preemptions": r.reclaims,
        "lost_gpu_h": round(r.lost_gpu_s / 3600, 1),
        "teams": [
            {"team": f"team{i}", "gpu_h": round(u / 3600), "borrowed_gpu_h": round(b / 3600)}
            for i, (u, b) in enumerate(r.teams)
        ],
        "cycles": r.cycles,
        "plan_ms_mean": round(1000 * statistics.fmean(plans), 3) if plans else 0.0,
        "plan_ms_p95": round(1000 * plans[min(len(plans) - 1, int(0.95 * len(plans)))], 3) if plans else 0.0,
    }


def acceptance(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 16's targets for kiln against the best baseline that does not know true runtimes."""
    kiln = next(s for s in summaries if s["policy"] == "kiln")
    base = [s for s in summaries if s["policy"] != "kiln" and not s["oracle"]]
    best_jct = min(base, key=lambda s: s["jct"]["mean_h"])
    best_util = max(base, key=lambda s: s["util_makespan"])
    cut = 1 - kiln["jct"]["mean_h"] / best_jct["jct"]["mean_h"] if best_jct["jct"]["mean_h"] else 0.0
    return {
        "gold_sla": kiln["sla_attainment"]["gold"]["attainment"],
        "gold_sla_ok": kiln["sla_attainment"]["gold"]["attainment"] >= 0.99,
        "best_baseline_jct": best_jct["policy"],
        "jct_cut_vs_best_baseline": round(cut, 4),
        "jct_ok": cut >= 0.20,
        "best_baseline_util": best_util["policy"],
        "util_makespan_gap_points": round(100 * (kiln["util_makespan"] - best_util["util_makespan"]), 2),
        "util_ok": kiln["util_makespan"] >= best_util["util_makespan"] - 0.01,
        "preemptions_per_job": kiln["preemptions_per_job"],
        "preemptions_ok": kiln["preemptions_per_job"] <= 0.5,
        "lost_gpu_h": kiln["lost_gpu_h"],
    }


def plot(results: list[Result], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, idx, label in (("queue", 1, "pending jobs"), ("utilisation", 2, "busy GPUs (%)")):
        fig, ax = plt.subplots(figsize=(9, 3.5))
        for r in results:
            ts = [s[0] / 86400 for s in r.series]
            ys = [s[idx] if idx == 1 else 100 * s[idx] / r.gpus for s in r.series]
            ax.plot(ts, ys, label=r.name, linewidth=0.8)
        ax.set_xlabel("simulated days")
        ax.set_ylabel(label)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"simulate_{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


def table(summaries: list[dict[str, Any]]) -> str:
    head = (
        "| policy | mean JCT h | p50 JCT h | p95 JCT h | mean wait h | p95 wait h | util (makespan) | "
        "makespan d | gold SLA | silver SLA | bronze SLA | preemptions / job | lost GPU-h |"
    )
    lines = [head, "|" + "---|" * 13]
    for s in summaries:
        sla = s["sla_attainment"]
        name = f"{s['policy']} (ORACLE BOUND)" if s["oracle"] else s["policy"]
        lines.append(
            f"| {name} | {s['jct']['mean_h']:.1f} | {s['jct']['p50_h']:.1f} | {s['jct']['p95_h']:.1f} | "
            f"{s['wait']['mean_h']:.1f} | {s['wait']['p95_h']:.1f} | {s['util_makespan']:.1%} | "
            f"{s['makespan_days']:.1f} | {sla['gold']['attainment']:.1%} | {sla['silver']['attainment']:.1%} | "
            f"{sla['bronze']['attainment']:.1%} | {s['preemptions_per_job']:.3f} | {s['lost_gpu_h']:,.0f} |"
        )
    return "\n".join(lines)


def across_draws(draws: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 16's targets on each draw of the users' limits (``--limit-seed N,M,...``), per size and in all: a policy
    that meets them on one draw only is tuned to that draw."""
    sizes: dict[int, dict[str, Any]] = {}
    every: list[int] = []
    for draw in draws:
        seed, met_all = draw["limit_seed"], True
        for entry in draw["sizes"]:
            a = entry.get("acceptance")
            if a is None:
                return {}
            met = all(a[k] for k in ("gold_sla_ok", "jct_ok", "util_ok", "preemptions_ok"))
            met_all = met_all and met
            row = sizes.setdefault(entry["hosts"], {"hosts": entry["hosts"], "met_on": [], "by_seed": {}})
            row["by_seed"][str(seed)] = {
                k: a[k]
                for k in ("jct_cut_vs_best_baseline", "util_makespan_gap_points", "gold_sla", "preemptions_per_job")
            }
            if met:
                row["met_on"].append(seed)
        if met_all:
            every.append(seed)
    return {"seeds": [d["limit_seed"] for d in draws], "every_target_met_on": every, "sizes": list(sizes.values())}
