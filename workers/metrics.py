"""A worker's own metrics (core/process_metrics.py serves them on ``KILN_WORKER_METRICS_PORT``). No team names.

| metric | type | what |
|---|---|---|
| ``kiln_worker_heartbeat_seconds`` | histogram | one host heartbeat, committed to the database |
| ``kiln_worker_heartbeat_failures_total`` | counter | heartbeats that failed (database away) |
| ``kiln_worker_last_heartbeat_timestamp_seconds`` | gauge | unix time of the last committed heartbeat |
| ``kiln_worker_gpu_sample_seconds`` | histogram | one NVML sample of every GPU of the host |
| ``kiln_worker_gpu_healthy`` | gauge | per ``gpu`` (index): 0 once NVML reported an Xid or uncorrected ECC error |
| ``kiln_worker_gpu_errors_total`` | counter | NVML error reports |
| ``kiln_worker_mps_running`` | gauge | 1 while the host's MPS daemon runs (hosts that offer GPU shares) |
| ``kiln_worker_mps_restarts_total`` | counter | times the MPS daemon died and was started again |
| ``kiln_worker_attempts_running`` | gauge | attempts this worker supervises now |
| ``kiln_worker_attempts_total`` | counter | attempts ended, by ``outcome`` (succeeded, preempted, refused...) |
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.heartbeat_seconds = Histogram(
            "kiln_worker_heartbeat_seconds", "One committed host heartbeat", buckets=BUCKETS, registry=r
        )
        self.heartbeat_failures = Counter("kiln_worker_heartbeat_failures", "Host heartbeats that failed", registry=r)
        self.last_heartbeat = Gauge(
            "kiln_worker_last_heartbeat_timestamp_seconds", "Unix time of the last committed heartbeat", registry=r
        )
        self.gpu_sample_seconds = Histogram(
            "kiln_worker_gpu_sample_seconds", "One NVML sample of the host's GPUs", buckets=BUCKETS, registry=r
        )
        self.gpu_healthy = Gauge(
            "kiln_worker_gpu_healthy", "1 while NVML reports no error for the GPU", ["gpu"], registry=r
        )
        self.gpu_errors = Counter("kiln_worker_gpu_errors", "NVML error reports (Xid, uncorrected ECC)", registry=r)
        self.mps_running = Gauge("kiln_worker_mps_running", "1 while the host's MPS daemon runs", registry=r)
        self.mps_restarts = Counter("kiln_worker_mps_restarts", "MPS daemon restarts", registry=r)
        self.attempts_running = Gauge("kiln_worker_attempts_running", "Attempts supervised now", registry=r)
        self.attempts = Counter("kiln_worker_attempts", "Attempts ended, by outcome", ["outcome"], registry=r)
