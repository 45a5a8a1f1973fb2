"""Telemetry: one JSON object per line in ``RUN_DIR/telemetry/rank{R}.jsonl`` (core.trainer_protocol).

The worker tails these files and relays them.  Writes are line-buffered, flushed per record and serialised
by a lock, because the heartbeat and NVML threads write beside the training loop.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

from core.trainer_protocol import TELEMETRY_DIR, RecordKind


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: report them as null (absent), never as a made-up number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class Telemetry:
    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.rank = rank
        self.dir = pathlib.Path(run_dir) / TELEMETRY_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"rank{rank}.jsonl"
        self._fh = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as self
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def emit(self, kind: RecordKind, **fields: Any) -> None:
        record = {"ts": time.time(), "rank": self.rank, "kind": str(kind), **_clean(fields)}
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line + "\n")
                self._fh.flush()

    def event(self, type_: str, message: str, **fields: Any) -> None:
        self.emit(RecordKind.EVENT, type=type_, message=message, fields=fields)

    def diagnostic(self, type_: str, message: str, **fields: Any) -> None:
        self.emit(RecordKind.DIAGNOSTIC, type=type_, message=message, fields=fields)

    def every(self, interval_s: float, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` every ``interval_s`` in a daemon thread until ``close``; errors become events."""

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    fn()
                except Exception as exc:  # a broken sampler must never take the training down
                    self.event("TELEMETRY_ERROR", f"{name}: {exc!r}", sampler=name)

        t = threading.Thread(target=loop, name=f"kiln-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        with self._lock:
            self._fh.close()


class NvmlSampler:
    """NVML samples for one GPU: utilisation, memory, PCIe and NVLink throughput.

    PCIe comes from ``nvmlDeviceGetPcieThroughput`` (KB/s over a 20 ms window).  NVLink comes from the
    field-value counters (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``, cumulative KiB) differenced between
    samples.  A link or counter the device does not have is reported as null, never as 0.
    """

    def __init__(self, device_index: int) -> None:
        import pynvml  # nvidia-ml-py; imported lazily so CPU hosts never need it

        self.nv = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        self.uuid = pynvml.nvmlDeviceGetUUID(self.handle)
        self._last_nvlink: tuple[float, int, int] | None = None

    def _pcie(self, counter: int) -> float | None:
        try:
            return float(self.nv.nvmlDeviceGetPcieThroughput(self.handle, counter)) * 1024.0
        except self.nv.NVMLError:
            return None

    def _nvlink_totals(self) -> tuple[int, int] | None:
        nv = self.nv
        try:
            values = nv.nvmlDeviceGetFieldValues(
                self.handle, [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
            )
        except (nv.NVMLError, AttributeError):
            return None
        out = []
        for v in values:
            if v.nvmlReturn != nv.NVML_SUCCESS:
                return None
            out.append(int(v.value.ullVal))
        return out[0], out[1]

    def sample(self) -> dict[str, Any]:
        nv = self.nv
        util = nv.nvmlDeviceGetUtilizationRates(self.handle)
        mem = nv.nvmlDeviceGetMemoryInfo(self.handle)
        now = time.monotonic()
        nvlink_tx = nvlink_rx = None
        totals = self._nvlink_totals()
        if totals is not None:
            if self._last_nvlink is not None:
                t0, tx0, rx0 = self._last_nvlink
                dt = max(now - t0, 1e-6)
                nvlink_tx = (totals[0] - tx0) * 1024.0 / dt
                nvlink_rx = (totals[1] - rx0) * 1024.0 / dt
            self._last_nvlink = (now, totals[0], totals[1])
        return {
            "gpu_uuid": self.uuid,
            "util_gpu": util.gpu,
            "util_mem": util.memory,
            "mem_used_bytes": int(mem.used),
            "mem_total_bytes": int(mem.total),
            "pcie_tx_bytes_per_s": self._pcie(nv.NVML_PCIE_UTIL_TX_BYTES),
            "pcie_rx_bytes_per_s": self._pcie(nv.NVML_PCIE_UTIL_RX_BYTES),
            "nvlink_tx_bytes_per_s": nvlink_tx,
            "nvlink_rx_bytes_per_s": nvlink_rx,
            "nvlink_present": totals is not None,
        }
