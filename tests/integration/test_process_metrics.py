"""The scheduler's and a worker's own metrics: a worker's GPU health from NVML (the replayed recording, as on a
machine without a GPU), and each process's listener serving its registry."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.orm import Session

from core.process_metrics import serve
from core.settings import Settings
from harness.services import free_port
from tests.support.nvml_replay import NVMLReplay
from workers.host_agent import HostAgent
from workers.metrics import WorkerMetrics

pytestmark = pytest.mark.integration

GIB = 1024**3


def _sample(uuid: str, **extra: object) -> dict[str, object]:
    return {
        "uuid": uuid,
        "ts": 0.0,
        "utilization_pct": 50.0,
        "memory_used_bytes": GIB,
        "pcie_tx_bytes_per_s": None,
        "pcie_rx_bytes_per_s": None,
        "nvlink_tx_bytes_per_s": None,
        "nvlink_rx_bytes_per_s": None,
        "temperature_c": 50.0,
        "ecc_uncorrected": 0,
        **extra,
    }


def test_gpu_health_follows_nvml(db: Session, tmp_path: Path) -> None:
    gpus = [
        {
            "uuid": f"GPU-m-{i}",
            "index": i,
            "model": "NVIDIA H200",
            "memory_bytes": 141 * GIB,
            "mig_mode": False,
            "pcie_gen": 5,
            "nvlink_peers": [],
        }
        for i in range(2)
    ]
    samples = [[_sample("GPU-m-0"), _sample("GPU-m-1")], [_sample("GPU-m-0"), _sample("GPU-m-1", xid_errors=[79])]]
    recording = tmp_path / "nvml.json"
    recording.write_text(json.dumps({"gpus": gpus, "samples": samples}))
    metrics = WorkerMetrics()
    agent = HostAgent(
        name="metrics-host",
        inventory=NVMLReplay(recording),
        cpu_slots=0,
        address=None,
        settings=Settings(heartbeat_interval_s=1),
        metrics=metrics,
    )
    agent.register(db)
    agent.sample(db)
    value = metrics.registry.get_sample_value
    assert value("kiln_worker_gpu_healthy", {"gpu": "0"}) == 1 and value("kiln_worker_gpu_healthy", {"gpu": "1"}) == 1
    agent.sample(db)  # GPU 1 reports Xid 79 (fell off the bus)
    assert value("kiln_worker_gpu_healthy", {"gpu": "0"}) == 1 and value("kiln_worker_gpu_healthy", {"gpu": "1"}) == 0
    assert value("kiln_worker_gpu_errors_total") == 1
    assert value("kiln_worker_gpu_sample_seconds_count") == 2


def test_a_process_serves_its_registry_and_survives_a_taken_port() -> None:
    registry = CollectorRegistry()
    Counter("kiln_probe", "a probe", registry=registry).inc(3)
    port = free_port()
    assert serve(registry, port=port, bind="127.0.0.1", what="test")
    assert "kiln_probe_total 3.0" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert not serve(registry, port=port, bind="127.0.0.1", what="test")  # taken: logged, not raised
    assert not serve(registry, port=0, bind="127.0.0.1", what="test")  # 0: off
