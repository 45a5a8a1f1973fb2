"""When and where a job of a given shape can start earliest, given the running jobs' projected ends: the start a
reservation holds, and whether waiting starts a job by its limit (a preemption's patience)."""

from __future__ import annotations

from collections.abc import Set

from scheduler.policy.placement import INF, Chosen, ClusterState, Request


def shape_of(req: Request) -> Request:
    """The request without its end: where a job can start does not depend on how long it runs."""
    return Request(
        req.models, req.units, req.per_node, req.min_memory, req.bandwidth, end=None, team_code=req.team_code
    )


def _free_now(state: ClusterState, models: set[str]) -> int:
    return sum(state.free_count.get(m, 0) - state.reserved_free.get(m, 0) for m in models)


def earliest(
    state: ClusterState, ends: list[tuple[float, int]], claimed: Set[int], req: Request
) -> tuple[Chosen | None, float]:
    """Where and when a job of shape ``req`` can start earliest, given running jobs' projected ``ends`` (sorted).

    Units freed by the first k ends (preempted jobs end now; ``claimed`` and reserved units excluded). Fitting is
    monotone in k, so the smallest k is found by bisection.
    """
    head = shape_of(req)
    models = set(req.models)
    free = _free_now(state, models)
    freed: list[str] = []  # units in the order they free up
    steps: list[tuple[float, int]] = []  # (end, how many of ``freed`` are free by then), enough units only
    for end, jid in ends:
        if jid in claimed:
            continue
        for u in state.job_units.get(jid, ()):
            if u not in state.reserved and state.model_of(u) in models:
                freed.append(u)
        if free + len(freed) >= req.units:
            steps.append((end, len(freed)))

    def at(i: int) -> Chosen | None:
        return state.find(head, extra=frozenset(freed[: steps[i][1]]))

    if not steps or at(len(steps) - 1) is None:
        return None, INF
    lo, hi = 0, len(steps) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if at(mid) is not None:
            hi = mid
        else:
            lo = mid + 1
    return at(hi), steps[hi][0]


def starts_by(
    state: ClusterState, ends: list[tuple[float, int]], claimed: Set[int], req: Request, limit: float
) -> bool:
    """Whether a job of shape ``req`` can start by ``limit`` once the running jobs projected to end by then
    have ended: one placement trial (``earliest`` would bisect for the exact start, which this question does
    not need; fitting is monotone in the ends, so the answers agree)."""
    models = set(req.models)
    free = _free_now(state, models)
    freed: list[str] = []
    ended = False
    for end, jid in ends:
        if end > limit:
            break
        if jid in claimed:
            continue
        ended = True
        for u in state.job_units.get(jid, ()):
            if u not in state.reserved and state.model_of(u) in models:
                freed.append(u)
    if not ended or free + len(freed) < req.units:
        return False
    return state.find(shape_of(req), extra=frozenset(freed)) is not None
