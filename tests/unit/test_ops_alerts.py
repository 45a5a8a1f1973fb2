"""The alert rules in ops/prometheus/ (and the Grafana dashboard beside them) name only metrics kiln exports:
the API's (HTTP, jobs by state, the operators' metrics from the database), the scheduler's and the workers'.
``promtool check rules``, where promtool is installed: tests/e2e/test_promtool_rules.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from api.middleware import MetricsMiddleware
from api.routers.health import JobsByStateCollector
from core.services.ops_metrics import OpsSnapshot, families
from scheduler.live.metrics import SchedulerMetrics
from workers.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "ops" / "prometheus" / "alerts.yml"
DASHBOARDS = sorted((ROOT / "ops" / "grafana").glob("*.json"))
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "gauge": ("",),
}
DURATION = re.compile(r"^\d+[smhdw]$")


def exported_series() -> set[str]:
    """Every series name kiln's processes can expose."""
    http = CollectorRegistry()
    MetricsMiddleware(app=None, registry=http)  # type: ignore[arg-type]
    registries = [http, SchedulerMetrics().registry, WorkerMetrics().registry]
    metric_families: list[Metric] = [m for r in registries for m in r.collect()]
    metric_families += families(OpsSnapshot(window_s=86400))
    metric_families += list(JobsByStateCollector().describe())
    return {f.name + suffix for f in metric_families for suffix in SUFFIXES[f.type]}


def names_in(expr: str) -> set[str]:
    return set(re.findall(r"\b(kiln_[a-z0-9_]+)\b", expr))


def rules() -> Iterable[dict[str, object]]:
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        yield from group["rules"]


def test_every_alert_is_complete_and_names_exported_metrics() -> None:
    exported = exported_series()
    seen = set()
    for rule in rules():
        name = str(rule["alert"])
        assert name not in seen, f"{name}: two alerts with one name"
        seen.add(name)
        expr = str(rule["expr"])
        assert expr.count("(") == expr.count(")"), f"{name}: unbalanced parentheses"
        unknown = names_in(expr) - exported
        assert not unknown, f"{name}: kiln exports no {sorted(unknown)}"
        assert names_in(expr), f"{name}: names no kiln metric"
        assert DURATION.match(str(rule.get("for", "0s"))), f"{name}: 'for' is not a duration"
        labels = rule["labels"]
        assert isinstance(labels, dict) and labels.get("severity") in {"critical", "warning", "info"}, name
        annotations = rule["annotations"]
        assert isinstance(annotations, dict) and annotations.get("summary") and annotations.get("description"), name
    assert len(seen) >= 10


def test_the_grafana_dashboards_name_exported_metrics() -> None:
    exported = exported_series()
    assert len(DASHBOARDS) >= 2  # the API's (kiln-dashboard.json) and the processes' (kiln-processes.json)
    exprs = [e for board in DASHBOARDS for e in re.findall(r'"expr":\s*"((?:[^"\\]|\\.)*)"', board.read_text())]
    assert exprs
    for expr in exprs:
        unknown = names_in(json.loads(f'"{expr}"')) - exported
        assert not unknown, f"the dashboard's {expr!r} names {sorted(unknown)}"


def test_an_unknown_metric_is_caught() -> None:
    """The check above can fail: a misspelt name is not among the exported ones."""
    assert names_in("rate(kiln_scheduler_cycle_secs_bucket[5m])") - exported_series() == {
        "kiln_scheduler_cycle_secs_bucket"
    }
