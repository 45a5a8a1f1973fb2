"""The "raw" format of replicated state (DDP or one process): flat byte buffers streamed to a few data files.

It exists because ``torch.save`` + fsync + re-reading for the sha256 of a 1.5 GB state took ~3.5 s, far over a
10-step interval.  The staging buffers are a few flat byte arrays (pinned on CUDA), one per data file, laid out
once (``_FlatStager.layout``, from ``Checkpointer.prepare``) with every tensor at an aligned offset; the writer
threads stream each array straight to its file, hashing each chunk as it is written (``os.write`` and
``hashlib`` release the GIL on large buffers), and fsync in parallel.  ``tensors.json`` records each tensor's
file, offset, dtype and shape; ``tree.pt`` holds the state dicts' non-tensor structure (param groups,
hyperparameters), with ``{"__kiln_tensor__": index}`` where a tensor was.

The hashes computed on the way out are what the manifest records (see ``trainer.checkpoint.store``), so
nothing is read back to commit; a persisted copy is hashed the same way as it is copied.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import threading
import time
from typing import Any

import torch

from core.trainer_protocol import ENV_CKPT_WRITERS

ALIGN = 4096  # tensor offsets in the data files: any dtype's view of the byte buffer is aligned
CHUNK = 64 << 20  # bytes per write/hash call: large enough to release the GIL, small enough to interleave
TENSORS = "tensors.json"
TREE = "tree.pt"
_REF = "__kiln_tensor__"


def writer_count() -> int:
    """Parallel writer threads (and data files) per checkpoint: ``KILN_CKPT_WRITERS`` (the worker's
    ``Settings.ckpt_writers``, core.trainer_protocol), else min(8, cores)."""
    raw = os.environ.get(ENV_CKPT_WRITERS)
    return max(1, int(raw)) if raw else max(1, min(8, os.cpu_count() or 1))


def _flatten(obj: Any, leaves: list[torch.Tensor], seen: dict[tuple[int, tuple[int, ...], torch.dtype], int]) -> Any:
    """Replace every tensor in a state-dict tree by ``{_REF: index}`` (tied weights share one index)."""
    if isinstance(obj, torch.Tensor):
        key = (obj.data_ptr(), tuple(obj.shape), obj.dtype)
        if obj.numel() and key in seen:
            return {_REF: seen[key]}
        leaves.append(obj)
        if obj.numel():
            seen[key] = len(leaves) - 1
        return {_REF: len(leaves) - 1}
    if isinstance(obj, dict):
        return {k: _flatten(v, leaves, seen) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_flatten(v, leaves, seen) for v in obj)
    return obj


def _unflatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and _REF in obj:
            return tensors[obj[_REF]]
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unflatten(v, tensors) for v in obj)
    return obj


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _FlatStager:
    """Reusable CPU staging for a state dict: a few flat byte buffers (pinned on CUDA, so the device-to-host
    copy is asynchronous on a side stream), one per data file, each tensor at an aligned offset.

    The layout is computed, and the buffers allocated, once (``prepare`` at start-up: pinning 1.5 GB costs
    ~1 s, which must not land on a save); it is redone only if the state's shapes or dtypes change."""

    def __init__(self, device: torch.device, files: int) -> None:
        self.device = device
        self.files = files
        self.signature: list[tuple[tuple[int, ...], torch.dtype]] | None = None
        self.entries: list[dict[str, Any]] = []
        self.buffers: list[torch.Tensor] = []
        self.views: list[torch.Tensor] = []
        self.alloc_s = 0.0
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.done: torch.cuda.Event | None = None
        self._allocating: threading.Thread | None = None

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    def layout(self, leaves: list[torch.Tensor], *, background: bool = False) -> None:
        """Lay the buffers out for ``leaves``; with ``background``, allocate them in a thread: pinning a GB takes
        about a second, which a resumed job's first step need not wait for (the first ``stage`` does, if it comes
        sooner). The thread writes no telemetry."""
        self.ready()
        sig = [(tuple(t.shape), t.dtype) for t in leaves]
        if sig == self.signature:
            return
        if not background:
            self._allocate(leaves, sig)
            return
        self._allocating = threading.Thread(
            target=self._allocate, args=(leaves, sig), name="kiln-ckpt-staging", daemon=True
        )
        self._allocating.start()

    def ready(self) -> None:
        """Wait for a background allocation, if one is under way."""
        if self._allocating is not None:
            self._allocating.join()
            self._allocating = None

    def _allocate(self, leaves: list[torch.Tensor], sig: list[tuple[tuple[int, ...], torch.dtype]]) -> None:
        t0 = time.perf_counter()
        sizes = [t.numel() * t.element_size() for t in leaves]
        files = max(1, min(self.files, sum(1 for n in sizes if n)))  # no empty data files
        fill = [0] * files
        self.entries = [{} for _ in leaves]
        # Largest first onto the least-filled file: the files (and so the writer threads) stay balanced.
        for i in sorted(range(len(leaves)), key=lambda i: -sizes[i]):
            f = min(range(files), key=fill.__getitem__)
            self.entries[i] = {
                "file": f"data_{f}.bin",
                "index": f,
                "offset": fill[f],
                "bytes": sizes[i],
                "dtype": _dtype_name(leaves[i].dtype),
                "shape": list(leaves[i].shape),
            }
            fill[f] += -(-sizes[i] // ALIGN) * ALIGN
        pin = self.device.type == "cuda"
        self.buffers = [torch.zeros(n, dtype=torch.uint8, pin_memory=pin) for n in fill]
        self.views = []
        for e, t in zip(self.entries, leaves, strict=True):
            buf = self.buffers[e["index"]]
            self.views.append(buf[e["offset"] : e["offset"] + e["bytes"]].view(t.dtype).view(t.shape))
        self.signature = sig
        self.alloc_s = time.perf_counter() - t0

    def stage(self, state: Any) -> Any:
        """Copy ``state``'s tensors into the buffers (asynchronously on CUDA); returns the tensor-free tree."""
        leaves: list[torch.Tensor] = []
        tree = _flatten(state, leaves, {})
        self.layout(leaves)  # waits for a background allocation first
        if self.stream is not None:
            # The copy must see the state as of now: order it after the work already queued.
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with ctx:
            for view, t in zip(self.views, leaves, strict=True):
                view.copy_(t.detach(), non_blocking=self.stream is not None)
        if self.stream is not None:
            self.done = torch.cuda.Event()
            self.done.record(self.stream)
        return tree

    def wait_copy(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def order_before_update(self) -> None:
        """Make the compute stream wait for an in-flight copy before the optimizer overwrites the params."""
        if self.done is not None:
            torch.cuda.current_stream(self.device).wait_event(self.done)


def _write_hashed(path: pathlib.Path, buf: torch.Tensor) -> tuple[int, str]:
    """Write a CPU byte buffer to ``path``, hashing each chunk as it goes out (no re-read), then fsync."""
    h = hashlib.sha256()
    mv = memoryview(buf.numpy().data).cast("B")  # the pinned buffer itself: no copy
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(mv), CHUNK):
            chunk = mv[off : off + CHUNK]
            h.update(chunk)
            while chunk:
                n = os.write(fd, chunk)
                chunk = chunk[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(mv), h.hexdigest()


def _copy_hashed(src: pathlib.Path, dst: pathlib.Path) -> tuple[int, str]:
    """Copy a committed file to ``dst`` (the persisting of a local checkpoint), hashing the bytes as they
    pass, then fsync: the caller compares the hash with the source manifest, so a local file corrupted after
    its commit is never made durable."""
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    mv = memoryview(buf)
    total = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb", buffering=0) as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while True:
                n = fin.readinto(mv)
                if not n:
                    break
                chunk = mv[:n]
                h.update(chunk)
                while chunk:
                    w = os.write(fd, chunk)
                    chunk = chunk[w:]
                total += n
            os.fsync(fd)
        finally:
            os.close(fd)
    return total, h.hexdigest()


def load_raw(path: pathlib.Path) -> Any:
    """The state tree of a "raw" checkpoint, tensors as CPU views of each data file read whole."""
    entries = json.loads((path / TENSORS).read_text())
    data = {}
    for name in {e["file"] for e in entries}:
        f = path / name
        data[name] = torch.from_file(str(f), shared=False, size=f.stat().st_size, dtype=torch.uint8)
    tensors = []
    for e in entries:
        dtype = getattr(torch, e["dtype"])
        if e["bytes"] == 0:
            tensors.append(torch.empty(e["shape"], dtype=dtype))
            continue
        raw = data[e["file"]][e["offset"] : e["offset"] + e["bytes"]]
        tensors.append(raw.view(dtype).view(e["shape"]))
    return _unflatten(torch.load(path / TREE, map_location="cpu", weights_only=True), tensors)
