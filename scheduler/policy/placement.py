"""Gang, topology-aware placement over a mutable copy of the cluster's free capacity.

Units are GPUs; a host's CPU slots are units too (model ``cpu``, uuid ``host/slotN``), so CPU jobs take the
same code path. A placement is all or nothing. Preference order: one host (best fit when packing, most free
when spreading), else as few hosts as possible. On a host the GPUs are chosen as the set with the most NVLink
edges among them, and ranks follow an NVLink path through that set, so ring neighbours (the heaviest
communicators of an all-reduce) share the fastest links; the ranks of one host are contiguous, so only one ring
edge per host crosses the network.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.policy.sharing import SharedGpu, best_shared
from scheduler.policy.snapshot import CPU, GpuShare, HostInfo, RunningJob

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Request:
    models: tuple[str, ...]  # candidate models, tried in order
    units: int
    per_node: int | None = None
    min_memory: int = 0
    bandwidth: tuple[tuple[str, float], ...] = ()
    end: float | None = None  # projected end if started now; may use reserved units that free later than this
    avoid: frozenset[str] = frozenset()  # hosts to use only when no placement without them fits
    team_code: bool = False  # only on hosts that may run a team's own code (``HostInfo.runs_team_code``)


@dataclass(frozen=True, slots=True)
class Reserved:
    until: float  # units may be used by a job that ends no later than this
    job_id: int


Chosen = tuple[tuple[str, tuple[str, ...]], ...]  # ((host, units in rank order), ...)


class _Template:
    """What a ``HostInfo`` implies that never changes within a cycle: unit order, NVLink peers, memory, models."""

    __slots__ = ("info", "order", "peers", "memory", "model_of", "free", "link_cap", "units")

    def __init__(self, info: HostInfo) -> None:
        self.info = info  # held, so that the id() it is cached under stays unique
        self.order: dict[str, int] = {}
        self.peers: dict[str, frozenset[str]] = {}
        self.memory: dict[str, int] = {}
        self.model_of: dict[str, str] = {}
        free: dict[str, list[str]] = {}
        for i, gpu in enumerate(sorted(info.gpus, key=lambda g: g.index)):
            if not gpu.healthy:
                continue
            self.order[gpu.uuid] = i
            self.peers[gpu.uuid] = frozenset(gpu.nvlink_peers)
            self.memory[gpu.uuid] = gpu.memory_bytes
            self.model_of[gpu.uuid] = gpu.model
            if not info.excluded:
                free.setdefault(gpu.model, []).append(gpu.uuid)
        for s in range(info.cpu_slots):
            uuid = f"{info.name}/slot{s}"
            self.order[uuid] = len(self.order)
            self.model_of[uuid] = CPU
            self.memory[uuid] = 0
            if not info.excluded:
                free.setdefault(CPU, []).append(uuid)
        self.free = {m: tuple(us) for m, us in free.items()}
        self.link_cap = dict(info.links)


# Templates by id() of the HostInfo (which the template holds): the simulator and the benchmark pass the same host
# objects every cycle. Pure memoisation of a function of an immutable value; bounded.
_TEMPLATES: dict[int, _Template] = {}


def _template(info: HostInfo) -> _Template:
    t = _TEMPLATES.get(id(info))
    if t is None or t.info is not info:
        if len(_TEMPLATES) >= 8192:
            _TEMPLATES.clear()
        t = _TEMPLATES[id(info)] = _Template(info)
    return t


class _Host:
    __slots__ = ("name", "index", "queue", "order", "free", "link_cap", "link_used", "peers", "memory", "model_of")

    def __init__(self, info: HostInfo) -> None:
        t = _template(info)
        self.name = info.name
        self.index = 0  # position in ClusterState.hosts
        self.queue = info.queue
        # Shared with the template: read only.
        self.order = t.order
        self.peers = t.peers
        self.memory = t.memory
        self.model_of = t.model_of
        self.link_cap = t.link_cap
        self.free: dict[str, list[str]] = {m: list(us) for m, us in t.free.items()}  # model -> free, index order
        self.link_used: dict[str, float] = {}


class ClusterState:
    """Free units per host and model, link use, reservations. Built from a snapshot; mutated only by plan()."""

    def __init__(self, hosts: Iterable[HostInfo], running: Iterable[RunningJob], *, spread: bool = False) -> None:
        self.spread = spread
        infos = sorted(hosts, key=lambda h: h.name)
        self.hosts: list[_Host] = [_Host(h) for h in infos]
        self.by_name = {h.name: h for h in self.hosts}
        self.unit_host: dict[str, _Host] = {u: h for h in self.hosts for u in h.order}
        self.total: dict[str, int] = {}
        self.max_memory: dict[str, int] = {}
        for h in self.hosts:
            for u, m in h.model_of.items():
                self.total[m] = self.total.get(m, 0) + 1
                self.max_memory[m] = max(self.max_memory.get(m, 0), h.memory[u])
        self.free_count: dict[str, int] = {}
        self.reserved: dict[str, Reserved] = {}
        self.reserved_free: dict[str, int] = {}  # model -> free units that are reserved
        self.max_reserved_until = -INF
        self.untils: list[float] = []  # distinct ``until`` values reserved this cycle, sorted (may include stale ones)
        self.reserved_hosts: set[str] = set()
        self.version = 0  # bumped by every change of free capacity or reservations
        self._failed: dict[tuple[object, ...], int] = {}  # request shape -> fewest units known not to fit
        self._fits: dict[tuple[object, ...], tuple[int, Chosen]] = {}  # shape -> most units known to fit
        self.job_units: dict[int, tuple[str, ...]] = {}  # whole units only: what a job's end or preemption frees
        self.shared: dict[str, SharedGpu] = {}  # uuid -> the fractional jobs it holds (scheduler.policy.sharing)
        self.mps_hosts = {h.name for h in infos if h.mps}  # hosts whose MPS daemon runs: shares go there only
        self.code_hosts = {h.name for h in infos if h.runs_team_code}  # a team's own code goes there only
        for job in running:
            taken = self._take_running(job)
            if job.share is not None:
                self._share_running(job, job.share, taken)
                taken = ()
            self.job_units[job.id] = taken
            self._charge_links([p.host for p in job.placement], job.bandwidth, +1)
        # model -> indices (into self.hosts) of the hosts with a free unit of it: placement visits only these
        self.free_hosts: dict[str, set[int]] = {}
        for i, h in enumerate(self.hosts):
            h.index = i
            for m, units in h.free.items():
                self.free_count[m] = self.free_count.get(m, 0) + len(units)
                if units:
                    self.free_hosts.setdefault(m, set()).add(i)
        self.models = tuple(sorted(m for m in self.total if m != CPU))

    def _take_running(self, job: RunningJob) -> tuple[str, ...]:
        taken: list[str] = []
        for p in job.placement:
            h = self.by_name.get(p.host)
            if h is None:
                continue
            if p.gpus:
                for u in p.gpus:
                    model = h.model_of.get(u)
                    if model is not None and u in h.free.get(model, ()):
                        h.free[model].remove(u)
                    if model is not None:
                        taken.append(u)
            elif p.slots:
                slots = h.free.get(CPU, [])
                take = slots[: p.slots]
                del slots[: p.slots]
                taken.extend(take)
        return tuple(taken)

    def _share_running(self, job: RunningJob, share: GpuShare, units: tuple[str, ...]) -> None:
        for u in units:
            h = self.unit_host[u]
            gpu = self.shared.get(u)
            if gpu is None:
                gpu = self.shared[u] = SharedGpu(h.name, u, h.model_of[u], job.team_id, h.memory[u])
            gpu.add(share)

    def _charge_links(self, hosts: Iterable[str], bandwidth: tuple[tuple[str, float], ...], sign: int) -> None:
        for name in hosts:
            h = self.by_name.get(name)
            if h is None:
                continue
            for link, bps in bandwidth:
                h.link_used[link] = h.link_used.get(link, 0.0) + sign * bps

    # -- queries -------------------------------------------------------------------------------------------------

    def fits_links(self, h: _Host, bandwidth: tuple[tuple[str, float], ...]) -> bool:
        for link, bps in bandwidth:
            cap = h.link_cap.get(link)
            if cap is not None and h.link_used.get(link, 0.0) + bps > cap:
                return False
        return True

    def _usable(self, h: _Host, model: str, req: Request, respect: bool, extra: list[str] | None) -> list[str]:
        units = h.free.get(model, [])
        if respect and h.name in self.reserved_hosts:
            end = req.end
            units = [u for u in units if (r := self.reserved.get(u)) is None or (end is not None and end <= r.until)]
        if req.min_memory:
            units = [u for u in units if h.memory[u] >= req.min_memory]
        if extra:
            more = [u for u in extra if h.model_of[u] == model and h.memory[u] >= req.min_memory]
            if more:
                units = sorted(set(units).union(more), key=h.order.__getitem__)
        return units

    def find(
        self,
        req: Request,
        *,
        respect_reservations: bool = True,
        extra: frozenset[str] | None = None,
        check_links: bool = True,
        pick: bool = True,
    ) -> Chosen | None:
        """A placement for ``req`` on free units (plus ``extra``, units about to be freed), or None.

        ``pick=False`` answers feasibility only (units are not chosen for NVLink). Failures are remembered per
        request shape until capacity changes: a gang that did not fit, nor does a larger one of the same shape.
        """
        memo: tuple[object, ...] | None = None
        if not extra:
            if not respect_reservations:
                mode = "ignore"
            elif req.end is None or req.end > self.max_reserved_until:
                mode = "blocked"
            else:
                mode = ""
            if mode:
                memo = (
                    self.version,
                    req.models,
                    req.per_node,
                    req.min_memory,
                    req.bandwidth,
                    mode,
                    check_links,
                    req.team_code,
                )
                failed = self._failed.get(memo)
                if failed is not None and req.units >= failed:
                    return None
                fits = self._fits.get(memo)
                if not pick and fits is not None and req.units <= fits[0]:
                    return fits[1]
        chosen = self._find(req, respect_reservations, extra, check_links, pick)
        if memo is not None:
            if chosen is None:
                self._failed[memo] = min(req.units, self._failed.get(memo, req.units))
            elif not pick and req.units > self._fits.get(memo, (0, chosen))[0]:
                self._fits[memo] = (req.units, chosen)
        return chosen

    def _find(
        self, req: Request, respect_reservations: bool, extra: frozenset[str] | None, check_links: bool, pick: bool
    ) -> Chosen | None:
        extra_map: dict[str, list[str]] = {}
        for u in sorted(extra or ()):
            extra_map.setdefault(self.unit_host[u].name, []).append(u)
        for model in req.models:
            free = self.free_count.get(model, 0) + (len(extra) if extra else 0)
            if free < req.units:
                continue
            blocked = respect_reservations and not extra and (req.end is None or req.end > self.max_reserved_until)
            if blocked and free - self.reserved_free.get(model, 0) < req.units:
                continue
            chosen = self._find_model(model, req, respect_reservations, extra_map, check_links, pick)
            if chosen is not None:
                return chosen
        return None

    def _find_model(
        self,
        model: str,
        req: Request,
        respect: bool,
        extra_map: dict[str, list[str]],
        check_links: bool,
        pick: bool,
    ) -> Chosen | None:
        _pick = _pick_units if pick else _first
        n = req.units
        per_node = req.per_node if req.per_node and req.per_node < n else None
        candidates: list[tuple[int, int, _Host, list[str]]] = []
        total = 0
        visit = self.free_hosts.get(model, set())
        if extra_map:
            visit = visit | {self.by_name[name].index for name in extra_map}
        for i in sorted(visit):
            h = self.hosts[i]
            if req.team_code and h.name not in self.code_hosts:
                continue
            extra = extra_map.get(h.name) if extra_map else None
            units = self._usable(h, model, req, respect, extra)
            if not units or (per_node and len(units) < per_node):
                continue
            if check_links and req.bandwidth and not self.fits_links(h, req.bandwidth):
                continue
            candidates.append((len(units), i, h, units))
            total += len(units)
        if total < n:
            return None
        # Hosts the request would rather avoid (where its last attempt was lost) come last in every order below:
        # used only when what is left without them does not fit.
        avoid = req.avoid

        def away(c: tuple[int, int, _Host, list[str]]) -> bool:
            return bool(avoid) and c[2].name in avoid

        if per_node is None:
            fitting = [c for c in candidates if c[0] >= n]
            if fitting:
                best = (
                    min(fitting, key=lambda c: (away(c), -c[0], c[1]))
                    if self.spread
                    else min(fitting, key=lambda c: (away(c), c[0], c[1]))
                )
                return ((best[2].name, _pick(best[2], best[3], n)),)
            # Several hosts: the fewest, largest first; the remainder on the best-fitting host.
            ordered = sorted(candidates, key=lambda c: (away(c), -c[0], c[1]))
            out: list[tuple[str, tuple[str, ...]]] = []
            left = n
            for idx, (count, _i, h, units) in enumerate(ordered):
                if count >= left:
                    rest = [c for c in ordered[idx:] if c[0] >= left]
                    last = (
                        min(rest, key=lambda c: (away(c), -c[0], c[1]))
                        if self.spread
                        else min(rest, key=lambda c: (away(c), c[0], c[1]))
                    )
                    out.append((last[2].name, _pick(last[2], last[3], left)))
                    return tuple(out)
                out.append((h.name, _pick(h, units, count)))
                left -= count
            return None
        nodes = n // per_node
        if len(candidates) < nodes:
            return None
        ordered = (
            sorted(candidates, key=lambda c: (away(c), -c[0], c[1]))
            if self.spread
            else sorted(candidates, key=lambda c: (away(c), c[0], c[1]))
        )
        return tuple((h.name, _pick(h, units, per_node)) for _c, _i, h, units in ordered[:nodes])

    def find_share(self, team_id: int, req: Request, share: GpuShare) -> tuple[str, str, bool] | None:
        """(host, GPU uuid, whether the GPU is newly opened for sharing) for a fractional job, or None: a GPU its
        team already shares when one has room, else a free GPU on a host that runs MPS (reservations respected,
        the fullest such host first, so that whole hosts stay whole)."""
        joined = best_shared(self.shared.values(), team_id, req.models, share, req.avoid)
        if joined is not None:
            return joined.host, joined.uuid, False
        whole = Request(
            req.models, 1, min_memory=max(req.min_memory, share.memory_bytes), end=req.end, team_code=req.team_code
        )
        best: tuple[bool, int, int, str, str] | None = None
        for model in req.models:
            for i in sorted(self.free_hosts.get(model, ())):
                h = self.hosts[i]
                if h.name not in self.mps_hosts or (req.team_code and h.name not in self.code_hosts):
                    continue
                units = self._usable(h, model, whole, True, None)
                if units:
                    option = (h.name in req.avoid, len(units), i, h.name, units[0])
                    best = option if best is None or option < best else best
        return (best[3], best[4], True) if best is not None else None

    def allocate_share(self, job_id: int, team_id: int, host: str, uuid: str, share: GpuShare) -> None:
        gpu = self.shared.get(uuid)
        if gpu is None:
            self.allocate(job_id, ((host, (uuid,)),), ())
            h = self.by_name[host]
            gpu = self.shared[uuid] = SharedGpu(host, uuid, h.model_of[uuid], team_id, h.memory[uuid])
        gpu.add(share)
        self.job_units[job_id] = ()
        self.version += 1

    # -- mutations -----------------------------------------------------------------------------------------------

    def allocate(self, job_id: int, chosen: Chosen, bandwidth: tuple[tuple[str, float], ...]) -> None:
        units_all: list[str] = []
        for name, units in chosen:
            h = self.by_name[name]
            for u in units:
                model = h.model_of[u]
                h.free[model].remove(u)
                self.free_count[model] -= 1
                if not h.free[model]:
                    self.free_hosts[model].discard(h.index)
                r = self.reserved.pop(u, None)
                if r is not None:
                    self.reserved_free[model] -= 1
                units_all.append(u)
        self.version += 1
        self._charge_links([name for name, _ in chosen], bandwidth, +1)
        self.job_units[job_id] = tuple(units_all)

    def reserve(self, units: Iterable[str], until: float, job_id: int) -> None:
        for u in units:
            h = self.unit_host[u]
            model = h.model_of[u]
            is_free = u in h.free.get(model, ())
            prev = self.reserved.get(u)
            if prev is None:
                self.reserved[u] = Reserved(until, job_id)
                if is_free:
                    self.reserved_free[model] = self.reserved_free.get(model, 0) + 1
            elif until < prev.until:
                self.reserved[u] = Reserved(until, job_id)
            self.reserved_hosts.add(h.name)
            self.max_reserved_until = max(self.max_reserved_until, self.reserved[u].until)
        i = bisect.bisect_left(self.untils, until)
        if i == len(self.untils) or self.untils[i] != until:
            self.untils.insert(i, until)
        self.version += 1

    def end_class(self, end: float | None) -> int:
        """Jobs whose projected ends fall in the same class may use exactly the same reserved units.

        A reserved unit is usable by a job ending no later than its ``until``: the number of distinct ``until``
        values below ``end`` decides which ones. No end (or beyond every reservation) = none of them.
        """
        if end is None:
            return len(self.untils)
        return bisect.bisect_left(self.untils, end)

    def holder(self, chosen: Chosen) -> int | None:
        """The job holding a reservation on one of these units (for the Priority message)."""
        for _name, units in chosen:
            for u in units:
                r = self.reserved.get(u)
                if r is not None:
                    return r.job_id
        return None

    def model_of(self, unit: str) -> str | None:
        h = self.unit_host.get(unit)
        return h.model_of.get(unit) if h is not None else None

    def queue_of(self, host: str) -> str:
        return self.by_name[host].queue


def _first(h: _Host, units: list[str], k: int) -> tuple[str, ...]:
    return tuple(units[:k])


def _pick_units(h: _Host, units: list[str], k: int) -> tuple[str, ...]:
    """``k`` of ``units``: the most NVLink-connected set, in NVLink-path (rank) order."""
    if k >= len(units) or not any(h.peers.get(u) for u in units):
        return tuple(units[:k]) if k < len(units) else tuple(units)
    pool = set(units)
    best: list[str] | None = None
    best_score = -1
    for seed in units:
        chosen = [seed]
        left = pool - {seed}
        score = 0
        while len(chosen) < k:
            cset = set(chosen)
            nxt = max(left, key=lambda u: (len(h.peers.get(u, frozenset()) & cset), -h.order[u]))
            score += len(h.peers.get(nxt, frozenset()) & cset)
            chosen.append(nxt)
            left.discard(nxt)
        if score > best_score:
            best, best_score = chosen, score
    assert best is not None
    return _ring_order(h, best)


def _ring_order(h: _Host, units: list[str]) -> tuple[str, ...]:
    """Walk NVLink edges: each next rank is an NVLink peer of the previous one where possible."""
    left = sorted(units, key=h.order.__getitem__)
    path = [left.pop(0)]
    while left:
        peers = h.peers.get(path[-1], frozenset())
        nxt = next((u for u in left if u in peers), left[0])
        left.remove(nxt)
        path.append(nxt)
    return tuple(path)
