"""Start CUDA in the background while the trainer imports and meets its peers.

A rank's first CUDA call creates the device's primary context and its first GEMM loads cuBLAS: together about a
second (more on a sandboxed host) that used to fall inside the precision check, after every import. Neither
depends on anything the trainer does first, so a thread started before the heavy imports does both on the rank's
device (``LOCAL_RANK``, as torchrun numbers it among the worker's ``CUDA_VISIBLE_DEVICES``); the context and the
loaded library are the process's, so the main thread finds them ready. Any failure here is left for the main
thread to meet (and report) itself, where it would have met it without this.
"""

from __future__ import annotations

import os
import threading
import time

_thread: threading.Thread | None = None
_elapsed_s: float | None = None


def _warm() -> None:
    global _elapsed_s
    t0 = time.perf_counter()
    try:
        import torch

        if not torch.cuda.is_available():
            return
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        a = torch.ones(64, 64, device=device, dtype=torch.bfloat16)
        (a @ a).sum().item()  # the context, the allocator and cuBLAS, loaded
    except Exception:  # noqa: BLE001 - the main thread meets the same error at its own first CUDA call
        return
    _elapsed_s = time.perf_counter() - t0


def start() -> None:
    """Begin (once per process)."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_warm, name="kiln-cuda-warm", daemon=True)
        _thread.start()


def wait() -> float | None:
    """Block until the warm-up is done; the seconds it took in its thread (None: not started, no GPU, failed)."""
    if _thread is not None:
        _thread.join()
    return _elapsed_s
