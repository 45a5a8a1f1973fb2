"""Operators' metrics on ``/metrics``, computed from PostgreSQL at scrape time.

The database is the source of truth, so every API process reports the same values: nothing here counts in
process memory. A scrape runs a fixed handful of aggregate statements (core/repositories/ops_metrics.py),
whatever the number of teams, jobs, hosts or GPUs:

=====================================  =============  ==================================  ==========================
metric                                 type           labels                              from
=====================================  =============  ==================================  ==========================
kiln_sla_attainment_ratio              gauge          team, qos                           jobs submitted in window
kiln_sla_jobs                          gauge          team, qos                           jobs submitted in window
kiln_sla_violations_total              counter        team, qos, kind                     SLA_* violation events;
                                                                                          RECOVERED with met=false
kiln_queue_wait_seconds                gaugehistogram qos                                 jobs admitted in window
kiln_jobs_pending                      gauge          reason, qos                         QUEUED jobs
kiln_preemptions_total                 counter        team, qos                           PREEMPTING events
kiln_restarts_total                    counter        team, qos, reason                   QUEUED events of restarts
kiln_recovery_time_seconds             histogram      qos                                 RECOVERED events
kiln_gpu_utilization_ratio             gauge          host, gpu                           gpus.last_sample
kiln_gpu_memory_used_bytes             gauge          host, gpu                           gpus.last_sample
kiln_gpu_link_bytes_per_second         gauge          host, gpu, link, direction          gpus.last_sample
kiln_hosts                             gauge          state                               hosts
kiln_compile_cache_lookups_total       counter        team, result, source                COMPILE_OK (hit, miss),
                                                                                          COMPILE_CACHE_REJECTED
kiln_compile_cache_seconds_saved_total counter        team                                COMPILE_OK's saved_s
=====================================  =============  ==================================  ==========================

The window is the last 24 h. Counters are all-time event counts (monotonic, so ``rate``/``increase`` work);
the queue wait is a snapshot of the window (a gauge histogram: quantiles without ``rate``).

Wiring (api/routers/health.py): ``OpsMetricsCollector`` is registered on the app's registry; the ``/metrics``
handler renders the registry inside ``scraping(session)``, which hands the request's session to the collector.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from core.db import utcnow
from core.repositories import compile_cache as compile_repo
from core.repositories import ops_metrics as repo
from core.services import compile_cache
from core.states import HostState

WINDOW = timedelta(hours=24)
QUEUE_WAIT_BUCKETS: tuple[float, ...] = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400)
RECOVERY_BUCKETS: tuple[float, ...] = (5, 10, 30, 60, 120, 180, 300, 600, 900, 1800, 3600)
GPU_SAMPLE_MAX_AGE_S = 300.0  # an older sample (a silent host agent) is not exported as the current value
HOST_STATES = tuple(s.value for s in HostState)
NO_REASON = "None"  # Slurm's word for a pending job without a reason
LINKS = (("pcie", "tx"), ("pcie", "rx"), ("nvlink", "tx"), ("nvlink", "rx"))
_VIOLATION_SUFFIXES = (
    "_VIOLATIONS",
    "_VIOLATION",
    "_VIOLATED",
    "_BREACHED",
    "_BREACH",
    "_MISSED",
    "_MISS",
    "_EXCEEDED",
)


def is_violation_event(event_type: str) -> bool:
    """Whether an event is an SLA violation (``scheduler.live.sla`` writes them); the SLA page and ``/metrics`` both
    use this. Its SQL twin is ``core.repositories.ops_metrics.is_violation_type``."""
    t = event_type.upper()
    return t.startswith("SLA") and ("VIOLAT" in t or "BREACH" in t or "MISS" in t or "EXCEED" in t)


def violation_kind(event_type: str, kind: str | None = None) -> str:
    """``data.kind`` when the event says it, else from the type: ``SLA_QUEUE_WAIT_VIOLATION`` -> ``queue_wait``."""
    if kind:
        return str(kind)
    t = event_type.upper().removeprefix("SLA").lstrip("_")
    for suffix in _VIOLATION_SUFFIXES:
        if t.endswith(suffix):
            t = t.removesuffix(suffix)
            break
    return t.lower() or "unknown"


@dataclass
class Histogram:
    """Cumulative bucket counts by upper bound (the last is +Inf), and the sum of observations."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * (len(self.bounds) + 1)

    def add_bucket(self, index: int, n: float, total: float) -> None:
        """``n`` observations falling in bucket ``index`` (not cumulative)."""
        for i in range(index, len(self.counts)):
            self.counts[i] += n
        self.sum += total

    def prometheus_buckets(self) -> list[tuple[str, float]]:
        les = [_le(b) for b in self.bounds] + ["+Inf"]
        return list(zip(les, self.counts, strict=True))


def _le(b: float) -> str:
    return str(float(b))


@dataclass
class OpsSnapshot:
    window_s: float
    attainment: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (team, qos) -> jobs, met
    violations: dict[tuple[str, str, str], int] = field(default_factory=lambda: defaultdict(int))
    queue_wait: dict[str, Histogram] = field(default_factory=dict)  # qos
    pending: dict[tuple[str, str], int] = field(default_factory=dict)  # (reason, qos)
    preemptions: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    restarts: dict[tuple[str, str, str], int] = field(default_factory=lambda: defaultdict(int))  # team, qos, reason
    recovery: dict[str, Histogram] = field(default_factory=dict)  # qos
    gpu_utilization: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, gpu uuid)
    gpu_memory: dict[tuple[str, str], float] = field(default_factory=dict)
    gpu_links: dict[tuple[str, str, str, str], float] = field(default_factory=dict)  # host, gpu, link, direction
    hosts: dict[str, int] = field(default_factory=dict)  # state
    evaluation: dict[tuple[str, str, str, str], float] = field(default_factory=dict)  # team, job, name, metric
    compile_lookups: dict[tuple[str, str, str], int] = field(default_factory=lambda: defaultdict(int))
    compile_saved: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # team


def snapshot(db: Session, *, now: datetime | None = None, window: timedelta = WINDOW) -> OpsSnapshot:
    """Everything the collector exports, in seven statements."""
    now = now or utcnow()
    since = now - window
    snap = OpsSnapshot(window_s=window.total_seconds())

    for team, qos, jobs, met in repo.attainment(db, since=since, now=now):
        snap.attainment[(team, qos)] = (int(jobs), int(met or 0))

    for row in repo.queue_wait_buckets(db, since=since, bounds=QUEUE_WAIT_BUCKETS):
        qos, *cumulative, count, total = row
        h = Histogram(QUEUE_WAIT_BUCKETS, counts=[float(c or 0) for c in cumulative] + [float(count)])
        h.sum = float(total or 0.0)
        snap.queue_wait[qos] = h

    for reason, qos, n in repo.pending_by_reason(db):
        key = (reason or NO_REASON, qos)
        snap.pending[key] = snap.pending.get(key, 0) + int(n)

    for type_, team, qos, label, bucket, n, recovery_sum in repo.event_counts(db, recovery_bounds=RECOVERY_BUCKETS):
        n = int(n)
        if type_ == repo.PREEMPTING:
            snap.preemptions[(team, qos)] += n
        elif type_ == repo.QUEUED:
            snap.restarts[(team, qos, label or "unknown")] += n
        elif type_ == repo.RECOVERED:
            if bucket is not None and bucket >= 0:
                hist = snap.recovery.setdefault(qos, Histogram(RECOVERY_BUCKETS))
                hist.add_bucket(int(bucket), n, float(recovery_sum or 0.0))
            if label == "recovery_time":
                snap.violations[(team, qos, "recovery_time")] += n
        elif is_violation_event(type_):
            snap.violations[(team, qos, violation_kind(type_, label))] += n

    for team, job_id, name, evaluation in repo.evaluations(db, since=since):
        metrics = evaluation.get("metrics") if isinstance(evaluation, dict) else None
        for metric, value in (metrics or {}).items():
            number = _number(value)
            if number is not None:
                snap.evaluation[(team, str(job_id), name, str(metric))] = number

    for team, type_, hit, source, n, saved in compile_repo.lookup_counts(db):
        result = "rejected" if type_ != compile_repo.COMPILE_OK else "hit" if hit else "miss"
        label = (compile_cache.source_name(source) if result != "miss" else None) or "none"
        snap.compile_lookups[(team, result, label)] += int(n)
        snap.compile_saved[team] += float(saved or 0.0)

    snap.hosts = dict.fromkeys(HOST_STATES, 0)
    seen_hosts: set[str] = set()
    now_epoch = now.timestamp()
    for host, state, gpu, sample in repo.hosts_and_gpus(db):
        if host not in seen_hosts:
            seen_hosts.add(host)
            snap.hosts[state] = snap.hosts.get(state, 0) + 1
        if gpu is None or not sample or state == HostState.DOWN:
            continue
        ts = _number(sample.get("ts"))
        if ts is None or now_epoch - ts > GPU_SAMPLE_MAX_AGE_S:
            continue
        util = _number(sample.get("utilization_pct"))
        if util is not None:
            snap.gpu_utilization[(host, gpu)] = util / 100.0
        mem = _number(sample.get("memory_used_bytes"))
        if mem is not None:
            snap.gpu_memory[(host, gpu)] = mem
        for link, direction in LINKS:
            value = _number(sample.get(f"{link}_{direction}_bytes_per_s"))
            if value is not None:  # None: not measurable here (no such link), never zero
                snap.gpu_links[(host, gpu, link, direction)] = value
    return snap


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)
_HistogramFamily = TypeVar("_HistogramFamily", GaugeHistogramMetricFamily, HistogramMetricFamily)


def _with_samples(family: _Family, values: Mapping[Any, float]) -> _Family:
    """``family`` with one sample per label key (a tuple of label values, or one value), sorted by key."""
    for key, v in sorted(values.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], v)
    return family


def _with_histograms(family: _HistogramFamily, values: Mapping[str, Histogram]) -> _HistogramFamily:
    """``family`` with one histogram per value of its single label, sorted."""
    for label, h in sorted(values.items()):
        family.add_metric([label], h.prometheus_buckets(), h.sum)
    return family


def families(snap: OpsSnapshot) -> list[Metric]:
    """Every metric family of a scrape, in the order /metrics lists them."""
    return [*_sla_families(snap), *_scheduling_families(snap), *_fleet_families(snap), *_code_families(snap)]


def _sla_families(snap: OpsSnapshot) -> list[Metric]:
    """SLA attainment, its denominator, violations and queue wait over the snapshot's window."""
    window = f"last {snap.window_s / 3600:g} h"
    ratio = GaugeMetricFamily(
        "kiln_sla_attainment_ratio",
        f"Share of jobs submitted in the {window} that met their SLA (queue wait within the contract's maximum, no "
        "SLA violation event); the SLA page's definition",
        labels=["team", "qos"],
    )
    jobs = GaugeMetricFamily(
        "kiln_sla_jobs", f"Jobs submitted in the {window} (the attainment's denominator)", labels=["team", "qos"]
    )
    for (team, qos), (n, met) in sorted(snap.attainment.items()):
        ratio.add_metric([team, qos], met / n if n else 1.0)
        jobs.add_metric([team, qos], n)

    return [
        ratio,
        jobs,
        _with_samples(
            CounterMetricFamily(
                "kiln_sla_violations",
                "SLA violations recorded as events (SLA_* violation events by kind; recovery_time: RECOVERED over the "
                "objective)",
                labels=["team", "qos", "kind"],
            ),
            snap.violations,
        ),
        _with_histograms(
            GaugeHistogramMetricFamily(
                "kiln_queue_wait_seconds",
                f"Wait from submission to admission of the jobs admitted in the {window} (a snapshot of the window: "
                "quantiles without rate())",
                labels=["qos"],
            ),
            snap.queue_wait,
        ),
    ]


def _scheduling_families(snap: OpsSnapshot) -> list[Metric]:
    """Pending jobs, preemptions, restarts and recovery times: what the scheduler did to the jobs."""
    return [
        _with_samples(
            GaugeMetricFamily("kiln_jobs_pending", "Queued jobs by pending reason", labels=["reason", "qos"]),
            snap.pending,
        ),
        _with_samples(
            CounterMetricFamily("kiln_preemptions", "Preemptions (PREEMPTING events)", labels=["team", "qos"]),
            snap.preemptions,
        ),
        _with_samples(
            CounterMetricFamily(
                "kiln_restarts",
                "Restarts after an infrastructure failure, by the LOST incident (lease_expired, never_started, "
                "infrastructure, nccl_error)",
                labels=["team", "qos", "reason"],
            ),
            snap.restarts,
        ),
        _with_histograms(
            HistogramMetricFamily(
                "kiln_recovery_time_seconds",
                "Recovery time of LOST incidents: failure to the first step of the next attempt (RECOVERED events)",
                labels=["qos"],
            ),
            snap.recovery,
        ),
    ]


def _fleet_families(snap: OpsSnapshot) -> list[Metric]:
    """The hosts and their GPUs: utilisation, memory, interconnect throughput, hosts by state."""
    return [
        _with_samples(
            GaugeMetricFamily(
                "kiln_gpu_utilization_ratio", "GPU utilisation, last sample of the host agent", labels=["host", "gpu"]
            ),
            snap.gpu_utilization,
        ),
        _with_samples(
            GaugeMetricFamily(
                "kiln_gpu_memory_used_bytes", "GPU memory used, last sample of the host agent", labels=["host", "gpu"]
            ),
            snap.gpu_memory,
        ),
        _with_samples(
            GaugeMetricFamily(
                "kiln_gpu_link_bytes_per_second",
                "Interconnect throughput per GPU, last sample (link: pcie or nvlink; direction: tx or rx)",
                labels=["host", "gpu", "link", "direction"],
            ),
            snap.gpu_links,
        ),
        _with_samples(GaugeMetricFamily("kiln_hosts", "Hosts by state", labels=["state"]), snap.hosts),
    ]


def _code_families(snap: OpsSnapshot) -> list[Metric]:
    """What the teams' code got: compile-cache lookups, the seconds its hits saved, the last evaluations."""
    return [
        _with_samples(
            CounterMetricFamily(
                "kiln_compile_cache_lookups",
                "Compile-cache lookups of attempts: result hit (source local, team or shared), miss (compiled cold), "
                "rejected (an entry from that source refused by its check; the attempt then compiles cold: a miss)",
                labels=["team", "result", "source"],
            ),
            snap.compile_lookups,
        ),
        _with_samples(
            CounterMetricFamily(
                "kiln_compile_cache_seconds_saved",
                "Compile seconds the compile cache's hits saved against their entries' cold compiles",
                labels=["team"],
            ),
            snap.compile_saved,
        ),
        _with_samples(
            GaugeMetricFamily(
                "kiln_job_evaluation",
                "The last evaluation of a team's own code (its evaluate()), per job active or ended in the window",
                labels=["team", "job", "name", "metric"],
            ),
            snap.evaluation,
        ),
    ]


_SCRAPE_SESSION: ContextVar[Session | None] = ContextVar("kiln_ops_metrics_session", default=None)


@contextmanager
def scraping(session: Session) -> Iterator[None]:
    """Render the registry inside this: the collector reads through ``session`` (the request's)."""
    token = _SCRAPE_SESSION.set(session)
    try:
        yield
    finally:
        _SCRAPE_SESSION.reset(token)


def scrape_session() -> Session | None:
    """The session of the scrape in progress (inside ``scraping``), else None."""
    return _SCRAPE_SESSION.get()


class OpsMetricsCollector(Collector):
    """A prometheus_client collector over ``snapshot``; outside ``scraping`` it yields nothing."""

    def __init__(self, snapshot_fn: Callable[[Session], OpsSnapshot] = snapshot) -> None:
        self._snapshot = snapshot_fn

    def collect(self) -> Iterable[Metric]:
        session = _SCRAPE_SESSION.get()
        if session is None:
            return []
        return families(self._snapshot(session))

    def describe(self) -> Iterable[Metric]:
        """The families without samples: lets the registry check names without touching the database."""
        return families(OpsSnapshot(window_s=WINDOW.total_seconds()))
