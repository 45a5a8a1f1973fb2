"""NVML sampling for a rank's telemetry (``core.telemetry.Telemetry`` writes the records the worker relays)."""

from __future__ import annotations

import time
from typing import Any


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
