"""The operators' metrics on /metrics (core/services/ops_metrics.py), computed from PostgreSQL at scrape time:
exact values over a small world of jobs, events and hosts, and a statement budget that does not grow with the
data (no N+1)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import GPU, Event, Host, Job, QosClass, SlaContract, Team, User
from core.services import tokens as tokens_svc
from core.services.principal import Principal
from tests.support.compile_events import relay_compiles
from tests.support.sql import statements

pytestmark = pytest.mark.integration

# The scrape token's lookup; kiln_jobs by state; attainment; queue wait; pending; event counters; hosts and GPUs;
# the evaluations of teams' own code; the compile cache's lookups
SCRAPE_BUDGET = 9

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
Scrape = Callable[[TestClient], Samples]


@pytest.fixture
def scrape(db: Session) -> Scrape:
    """Scrape /metrics with a scrape-only token (the ``metrics`` scope), as an admin issues one for Prometheus."""
    admin = User(name="metrics-admin")  # acts as an admin below; not one in the table (the tests bootstrap one)
    db.add_all([admin, User(name="prometheus")])
    db.flush()
    root = Principal(user_id=admin.id, name=admin.name, user_is_admin=True, scopes=frozenset({"admin"}))
    _, token = tokens_svc.issue(db=db, principal=root, name="prometheus", scopes=["metrics"], user="prometheus")
    db.flush()

    def get(client: TestClient) -> Samples:
        r = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        out: Samples = {}
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    return get


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


class World:
    def __init__(self, db: Session) -> None:
        self.db = db
        self.now = utcnow()
        self.qos = {q.name: q for q in db.scalars(select(QosClass))}

    def team(self, name: str) -> Team:
        t = Team(name=name)
        self.db.add(t)
        self.db.flush()
        return t

    def job(
        self,
        team: Team,
        qos: str,
        *,
        state: str,
        submitted_ago: float,
        wait: float | None = None,
        pending_reason: str | None = None,
        sla: dict[str, Any] | None = None,
    ) -> Job:
        submitted = self.now - timedelta(seconds=submitted_ago)
        j = Job(
            name="j",
            team_id=team.id,
            spec={"name": "j", "sla": sla or {}},
            state=state,
            qos_class_id=self.qos[qos].id,
            pending_reason=pending_reason,
            submitted_at=submitted,
            admitted_at=submitted + timedelta(seconds=wait) if wait is not None else None,
            queued_s=float(wait or 0),  # what core.transitions keeps: its wait before admission
        )
        self.db.add(j)
        self.db.flush()
        return j

    def event(self, job: Job, type_: str, ago: float = 60, **data: Any) -> None:
        at = self.now - timedelta(seconds=ago)
        self.db.add(Event(job_id=job.id, team_id=job.team_id, type=type_, data=data, created_at=at))
        self.db.flush()

    def host(self, name: str, state: str, samples: list[dict[str, Any] | None]) -> None:
        h = Host(name=name, queue=f"host.{name}", state=state)
        self.db.add(h)
        self.db.flush()
        for i, sample in enumerate(samples):
            self.db.add(
                GPU(
                    host_id=h.id,
                    uuid=f"GPU-{name}-{i}",
                    index=i,
                    model="H200",
                    memory_bytes=141 << 30,
                    last_sample=sample or {},
                )
            )
        self.db.flush()

    def sample(self, age_s: float = 5, **values: Any) -> dict[str, Any]:
        base = {f"{link}_{d}_bytes_per_s": None for link in ("pcie", "nvlink") for d in ("tx", "rx")}
        return {
            "ts": self.now.timestamp() - age_s,
            "utilization_pct": None,
            "memory_used_bytes": None,
            **base,
            **values,
        }


def build(db: Session) -> World:
    w = World(db)
    a, b = w.team("ops-a"), w.team("ops-b")
    db.add(SlaContract(team_id=a.id, qos_class_id=w.qos["best-effort"].id, max_queue_wait_s=1800.0))
    # ops-a / best-effort (no QoS default): limits from the job's spec, its own contract, the team default.
    j1 = w.job(a, "best-effort", state="RUNNING", submitted_ago=7200, wait=60, sla={"max_queue_wait_s": 600})
    j2 = w.job(a, "best-effort", state="RUNNING", submitted_ago=7200, wait=1200)
    db.add(SlaContract(team_id=a.id, job_id=j2.id, qos_class_id=w.qos["best-effort"].id, max_queue_wait_s=600.0))
    w.job(a, "best-effort", state="QUEUED", submitted_ago=3600, pending_reason="Quota")  # 3600 > 1800: violated
    j4 = w.job(a, "best-effort", state="QUEUED", submitted_ago=600, pending_reason="Quota")
    j5 = w.job(a, "best-effort", state="SUCCEEDED", submitted_ago=30 * 3600, wait=3600)  # outside the window
    j6 = w.job(a, "best-effort", state="RUNNING", submitted_ago=1800, wait=10)  # met by wait, violation event
    # ops-b / gold (QoS default 300 s).
    k1 = w.job(b, "gold", state="RUNNING", submitted_ago=900, wait=50)
    w.job(b, "gold", state="RUNNING", submitted_ago=900, wait=400)  # 400 > 300: violated
    w.job(b, "gold", state="QUEUED", submitted_ago=100, pending_reason="Resources")

    w.event(j1, "PREEMPTING")
    w.event(j1, "QUEUED", 60, **{"from": "PREEMPTING", "to": "QUEUED"})  # a preemption's requeue: not a restart
    w.event(j1, "PREEMPTING")
    w.event(k1, "PREEMPTING")
    w.event(j2, "LOST", incident="lease_expired")
    w.event(j2, "QUEUED", restart_count=1)
    w.event(j2, "RECOVERED", recovery_time_s=42.0, objective_s=300.0, met=True)
    w.event(j2, "LOST", incident="nccl_error")
    w.event(j2, "QUEUED", restart_count=2)
    w.event(j2, "RECOVERED", recovery_time_s=400.0, objective_s=300.0, met=False)
    w.event(k1, "LOST", incident="never_started")
    w.event(k1, "FAILED", restart_count=3)  # gave up: not a restart
    w.event(k1, "RECOVERED", recovery_time_s=7.5, objective_s=300.0, met=True)
    w.event(j6, "SLA_DEADLINE_VIOLATION")
    w.event(j5, "SLA_VIOLATION", ago=29 * 3600, kind="step_time")  # counted (all time), not in the window
    w.event(j4, "SLA_CONTRACT_UPDATED")  # not a violation

    w.host(
        "h-up",
        "UP",
        [
            w.sample(utilization_pct=75.0, memory_used_bytes=10**9, pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=2e9),
            w.sample(age_s=3600, utilization_pct=99.0),
        ],
    )
    w.host("h-excl", "EXCLUDED", [w.sample(utilization_pct=0.0, memory_used_bytes=0, nvlink_tx_bytes_per_s=5e10)])
    w.host("h-down", "DOWN", [w.sample(utilization_pct=50.0)])
    w.host("h-cpu", "UP", [])
    db.flush()
    return w


def test_ops_metrics_values(client: TestClient, db: Session, scrape: Scrape) -> None:
    build(db)
    s = scrape(client)

    # SLA attainment over the last 24 h: ops-a 2 of 5 (j1, j4), ops-b 2 of 3 (k1, and the queued one: 100 s so far).
    assert value(s, "kiln_sla_attainment_ratio", team="ops-a", qos="best-effort") == pytest.approx(2 / 5)
    assert value(s, "kiln_sla_jobs", team="ops-a", qos="best-effort") == 5
    assert value(s, "kiln_sla_attainment_ratio", team="ops-b", qos="gold") == pytest.approx(2 / 3)
    assert value(s, "kiln_sla_jobs", team="ops-b", qos="gold") == 3

    # Violation counters (all time, from events).
    assert series(s, "kiln_sla_violations_total") == {
        frozenset({"team": "ops-a", "qos": "best-effort", "kind": "deadline"}.items()): 1,
        frozenset({"team": "ops-a", "qos": "best-effort", "kind": "step_time"}.items()): 1,
        frozenset({"team": "ops-a", "qos": "best-effort", "kind": "recovery_time"}.items()): 1,
    }

    # Queue wait of jobs admitted in the window: best-effort 10, 60, 1200 s; gold 50, 400 s.
    be = {"qos": "best-effort"}
    assert value(s, "kiln_queue_wait_seconds_bucket", le="10.0", **be) == 1
    assert value(s, "kiln_queue_wait_seconds_bucket", le="60.0", **be) == 2
    assert value(s, "kiln_queue_wait_seconds_bucket", le="900.0", **be) == 2
    assert value(s, "kiln_queue_wait_seconds_bucket", le="1800.0", **be) == 3
    assert value(s, "kiln_queue_wait_seconds_bucket", le="+Inf", **be) == 3
    assert value(s, "kiln_queue_wait_seconds_gcount", **be) == 3
    assert value(s, "kiln_queue_wait_seconds_gsum", **be) == pytest.approx(1270.0)
    assert value(s, "kiln_queue_wait_seconds_bucket", le="30.0", qos="gold") == 0
    assert value(s, "kiln_queue_wait_seconds_bucket", le="60.0", qos="gold") == 1
    assert value(s, "kiln_queue_wait_seconds_bucket", le="600.0", qos="gold") == 2
    assert value(s, "kiln_queue_wait_seconds_gsum", qos="gold") == pytest.approx(450.0)

    assert value(s, "kiln_jobs_pending", reason="Quota", qos="best-effort") == 2
    assert value(s, "kiln_jobs_pending", reason="Resources", qos="gold") == 1

    assert value(s, "kiln_preemptions_total", team="ops-a", qos="best-effort") == 2
    assert value(s, "kiln_preemptions_total", team="ops-b", qos="gold") == 1
    assert series(s, "kiln_restarts_total") == {
        frozenset({"team": "ops-a", "qos": "best-effort", "reason": "lease_expired"}.items()): 1,
        frozenset({"team": "ops-a", "qos": "best-effort", "reason": "nccl_error"}.items()): 1,
    }

    assert value(s, "kiln_recovery_time_seconds_bucket", le="30.0", **be) == 0
    assert value(s, "kiln_recovery_time_seconds_bucket", le="60.0", **be) == 1
    assert value(s, "kiln_recovery_time_seconds_bucket", le="600.0", **be) == 2
    assert value(s, "kiln_recovery_time_seconds_count", **be) == 2
    assert value(s, "kiln_recovery_time_seconds_sum", **be) == pytest.approx(442.0)
    assert value(s, "kiln_recovery_time_seconds_bucket", le="10.0", qos="gold") == 1
    assert value(s, "kiln_recovery_time_seconds_sum", qos="gold") == pytest.approx(7.5)

    # GPUs: the stale sample and the DOWN host are not exported; absent links are absent, not zero.
    assert series(s, "kiln_gpu_utilization_ratio") == {
        frozenset({"host": "h-up", "gpu": "GPU-h-up-0"}.items()): 0.75,
        frozenset({"host": "h-excl", "gpu": "GPU-h-excl-0"}.items()): 0.0,
    }
    assert value(s, "kiln_gpu_memory_used_bytes", host="h-up", gpu="GPU-h-up-0") == 1e9
    assert series(s, "kiln_gpu_link_bytes_per_second") == {
        frozenset({"host": "h-up", "gpu": "GPU-h-up-0", "link": "pcie", "direction": "tx"}.items()): 1e9,
        frozenset({"host": "h-up", "gpu": "GPU-h-up-0", "link": "pcie", "direction": "rx"}.items()): 2e9,
        frozenset({"host": "h-excl", "gpu": "GPU-h-excl-0", "link": "nvlink", "direction": "tx"}.items()): 5e10,
    }
    assert value(s, "kiln_hosts", state="UP") == 2
    assert value(s, "kiln_hosts", state="DOWN") == 1
    assert value(s, "kiln_hosts", state="EXCLUDED") == 1

    # The existing series are still there.
    assert value(s, "kiln_jobs", state="QUEUED") == 3
    again = scrape(client)  # the middleware counts the first scrape once it has answered
    assert value(again, "kiln_http_requests_total", method="GET", route="/metrics", status="200") == 1


def test_ops_metrics_agree_with_the_sla_page(client: TestClient, db: Session, scrape: Scrape) -> None:
    """The SLA page (GET /v1/sla/attainment) and kiln_sla_attainment_ratio count the same jobs as met."""
    from core.services.bootstrap import bootstrap_admin

    build(db)
    _, secret = bootstrap_admin(db=db, name="root")
    db.flush()
    page = client.get("/v1/sla/attainment", params={"days": 1}, headers={"Authorization": f"Bearer {secret}"})
    assert page.status_code == 200, page.text
    s = scrape(client)
    for row in page.json()["series"]:
        if row["team"] in ("ops-a", "ops-b"):
            assert value(s, "kiln_sla_jobs", team=row["team"], qos=row["qos"]) == row["jobs"]
            ratio = value(s, "kiln_sla_attainment_ratio", team=row["team"], qos=row["qos"])
            assert ratio == pytest.approx(row["attainment"]), row


def _bulk(db: Session, w: World, n: int) -> None:
    """``n`` more jobs over more teams, each with events, and more hosts: the scrape's statements stay the same."""
    now: datetime = w.now
    teams = [w.team(f"bulk-{i}") for i in range(10)]
    qos_ids = [q.id for q in w.qos.values()]
    rows = [
        {
            "name": f"b{i}",
            "team_id": teams[i % 10].id,
            "spec": {"name": "b"},
            "qos_class_id": qos_ids[i % len(qos_ids)],
            "state": ("QUEUED", "RUNNING", "SUCCEEDED")[i % 3],
            "pending_reason": ("Quota", "Priority", None)[i % 3],
            "submitted_at": now - timedelta(seconds=60 + i % 80000),
            "admitted_at": now - timedelta(seconds=i % 60),
            "restart_count": 0,
            "priority": 0,
            "gpus": 0,
            "fencing_token": 0,
            "cancel_requested": False,
            "preempt_requested": False,
            "last_step": 0,
            "updated_at": now,
        }
        for i in range(n)
    ]
    ids = db.scalars(insert(Job).returning(Job.id), rows).all()
    events: list[dict[str, Any]] = []
    for i, job_id in enumerate(ids):
        team_id = teams[i % 10].id
        recovered = {"recovery_time_s": float(i % 900), "met": i % 2 == 0}
        for type_, data in (
            ("PREEMPTING", {}),
            ("LOST", {"incident": "lease_expired"}),
            ("QUEUED", {"restart_count": 1}),
            ("RECOVERED", recovered),
        ):
            events.append(
                {
                    "job_id": job_id,
                    "team_id": team_id,
                    "type": type_,
                    "data": data,
                    "message": "",
                    "created_at": now - timedelta(seconds=i % 80000),
                }
            )
    db.execute(insert(Event), events)
    for i in range(20):
        w.host(f"bulk-host-{i}", "UP", [w.sample(utilization_pct=float(g * 10)) for g in range(8)])
    db.flush()


def test_scrape_statements_do_not_grow_with_rows(
    client: TestClient, db: Session, scrape: Scrape, pg_engine: Engine
) -> None:
    w = build(db)
    scrape(client)
    with statements(pg_engine) as small:
        scrape(client)
    _bulk(db, w, 5000)
    scrape(client)
    with statements(pg_engine) as big:
        s = scrape(client)
    # A fixed number of aggregate queries, however many rows: no N+1. (Speed is for benchmarks, not tests.)
    assert len(small) == len(big) <= SCRAPE_BUDGET, big
    assert len(series(s, "kiln_gpu_utilization_ratio")) == 2 + 20 * 8
    assert sum(series(s, "kiln_preemptions_total").values()) == 3 + 5000


def test_grafana_dashboard_queries_match_the_exported_series(client: TestClient, db: Session, scrape: Scrape) -> None:
    """Every series and label that ops/grafana/kiln-dashboard.json queries is on /metrics."""
    import json
    import re
    from pathlib import Path

    build(db)
    scrape(client)
    s = scrape(client)
    labels_of: dict[str, set[str]] = {}
    for name, labels in s:
        labels_of.setdefault(name, set()).update(k for k, _ in labels)
    board = json.loads((Path(__file__).resolve().parents[2] / "ops/grafana/kiln-dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"]]
    checked = 0
    for expr in exprs:
        for name, selector in re.findall(r"(kiln_[a-z_]+)(?:\{([^}]*)\})?", expr):
            assert name in labels_of, f"{name} (in {expr!r}) is not exported"
            wanted = set(re.findall(r"([a-z_]+)\s*=~?", selector or ""))
            by = re.findall(r"by \(([^)]*)\)", expr)
            wanted |= {x.strip() for group in by for x in group.split(",")} - {"le"}
            assert wanted <= labels_of[name], f"{expr!r}: {name} has labels {labels_of[name]}"
            checked += 1
    assert checked >= 17


def test_the_last_evaluation_of_a_teams_code_is_exported(client: TestClient, db: Session, scrape: Scrape) -> None:
    build(db)
    running = db.scalars(select(Job).where(Job.state == "RUNNING").order_by(Job.id)).first()
    old = db.scalars(select(Job).where(Job.state == "SUCCEEDED").order_by(Job.id)).first()
    assert running is not None and old is not None
    running.eval_metrics = {"step": 200, "metrics": {"accuracy": 0.975, "heldout_loss": 0.12}}
    old.eval_metrics = {"step": 10, "metrics": {"accuracy": 0.5}}  # ended outside the window: not exported
    db.flush()
    team = db.get(Team, running.team_id)
    assert team is not None
    got = series(scrape(client), "kiln_job_evaluation")
    labels = {"team": team.name, "job": str(running.id), "name": running.name}
    assert got == {
        frozenset({**labels, "metric": "accuracy"}.items()): 0.975,
        frozenset({**labels, "metric": "heldout_loss"}.items()): 0.12,
    }


def test_compile_cache_lookups_by_result_and_source_and_the_seconds_saved(
    client: TestClient, db: Session, scrape: Scrape
) -> None:
    w = World(db)
    job = w.job(w.team("ops-cc"), "gold", state="RUNNING", submitted_ago=600)
    relay_compiles(db, job)  # two misses (one after a rejection), two hits from the team cache; every rank reports
    s = scrape(client)
    assert series(s, "kiln_compile_cache_lookups_total") == {
        frozenset({"team": "ops-cc", "result": "hit", "source": "team"}.items()): 2,
        frozenset({"team": "ops-cc", "result": "miss", "source": "none"}.items()): 2,
        frozenset({"team": "ops-cc", "result": "rejected", "source": "team"}.items()): 1,
    }
    assert value(s, "kiln_compile_cache_seconds_saved_total", team="ops-cc") == pytest.approx(21.3)
