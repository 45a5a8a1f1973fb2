"""The scheduler process's own metrics (core/process_metrics.py serves them on ``KILN_SCHEDULER_METRICS_PORT``).

| metric | type | what |
|---|---|---|
| ``kiln_scheduler_leader`` | gauge | 1 while this process leads |
| ``kiln_scheduler_cycle_seconds`` | histogram | one cycle: reconcile, snapshot, plan, apply, commit, dispatch |
| ``kiln_scheduler_plan_seconds`` | histogram | ``plan()`` alone |
| ``kiln_scheduler_cycle_failures_total`` | counter | cycles that raised (rolled back, retried on the next tick) |
| ``kiln_scheduler_decisions_total`` | counter | decision: admitted, preempted, failed, killed, reconciled, proposed |
| ``kiln_scheduler_pending_jobs`` | gauge | jobs left waiting by the last cycle |
| ``kiln_scheduler_dispatch_seconds`` | histogram | sending one attempt's Celery message to its host's queue |
| ``kiln_scheduler_dispatch_errors_total`` | counter | messages the broker refused (the reconciler re-dispatches) |
| ``kiln_webhook_deliveries_total`` | counter | by ``outcome``: delivered, retry, failed |
| ``kiln_webhook_delivery_seconds`` | histogram | one POST to a receiver, answered or not |
| ``kiln_retention_deleted_total`` | counter | rows retention removed, by ``what`` (core/retention.py) |
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DECISIONS = ("admitted", "preempted", "failed", "killed", "reconciled", "proposed")


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leader = Gauge("kiln_scheduler_leader", "1 while this scheduler process leads", registry=r)
        self.cycle_seconds = Histogram(
            "kiln_scheduler_cycle_seconds", "One scheduling cycle, dispatch included", buckets=FAST_BUCKETS, registry=r
        )
        self.plan_seconds = Histogram("kiln_scheduler_plan_seconds", "plan() alone", buckets=FAST_BUCKETS, registry=r)
        self.cycle_failures = Counter(
            "kiln_scheduler_cycle_failures", "Cycles that raised and were rolled back", registry=r
        )
        self.decisions = Counter("kiln_scheduler_decisions", "Decisions applied, by kind", ["decision"], registry=r)
        for kind in DECISIONS:
            self.decisions.labels(kind)
        self.pending = Gauge("kiln_scheduler_pending_jobs", "Jobs left waiting by the last cycle", registry=r)
        self.dispatch_seconds = Histogram(
            "kiln_scheduler_dispatch_seconds", "Sending one attempt's task message", buckets=FAST_BUCKETS, registry=r
        )
        self.dispatch_errors = Counter("kiln_scheduler_dispatch_errors", "Task messages the broker refused", registry=r)
        self.webhook_deliveries = Counter(
            "kiln_webhook_deliveries", "Webhook delivery attempts by outcome", ["outcome"], registry=r
        )
        for outcome in ("delivered", "retry", "failed"):
            self.webhook_deliveries.labels(outcome)
        self.retention_deleted = Counter(
            "kiln_retention_deleted", "Rows retention removed, by kind", ["what"], registry=r
        )
        self.webhook_seconds = Histogram(
            "kiln_webhook_delivery_seconds", "One POST to a webhook receiver", buckets=FAST_BUCKETS, registry=r
        )
