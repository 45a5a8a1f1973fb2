"""torch.compile behind a circuit breaker (a compile that hangs, runs out of memory or fails falls back to eager,
so a job always starts), with a persistent compile cache (a restarted job does not pay the compile again).

Regional compile (each repeated block, ``fullgraph=True``) is the default: identical blocks share one graph,
so compile time does not grow with depth.  Whole-model compile is an option.  Compilation is lazy in
torch, so the breaker forces it in a warm-up forward+backward on the first batch, on the bare (unwrapped)
model so no collective can hang a peer if this rank's compile dies:

* a wall-clock limit (SIGALRM interrupts the compiler in the main thread)   -> FALLBACK_COMPILE_TIMEOUT
* host RSS of this process and its compile workers over a limit            -> FALLBACK_OOM_DETECTED
* an op Dynamo cannot capture in one graph                                 -> FALLBACK_UNSUPPORTED_OP
* the compiled first-step loss not allclose to eager's                      -> FALLBACK_NUMERIC_MISMATCH
* any other compiler error                                                  -> FALLBACK_COMPILE_ERROR

A fallback reverts to eager and emits an event with model, graph, elapsed, peak RSS and device.  Ranks
agree: if any rank falls back, all do (a mixed compiled/eager job would still be correct, but slower ranks
would set the pace, and reporting one mode per job is simpler for the control plane).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch import nn

from trainer import compile_preload
from trainer.config import TestHooks
from trainer.telemetry import Telemetry
from trainer.user_error import user_code


class _Trip(Exception):
    """Raised in the main thread by the breaker's alarm (timeout or RSS)."""


@dataclasses.dataclass
class CompileReport:
    mode: str  # regional | whole | off
    active: bool  # compiled code is in use (False after a fallback)
    reason: str | None = None  # the FALLBACK_* event type, if any
    elapsed_s: float = 0.0
    peak_rss_bytes: int = 0
    cache_key: str | None = None
    cache_hit: bool = False
    eager_loss: float | None = None
    compiled_loss: float | None = None
    error: str | None = None
    cache_source: str | None = None  # "artifacts" (installed from the blob) or "local" (Inductor's dirs here)
    load_s: float = 0.0  # reading + installing cached artifacts (part of elapsed_s)
    phases: dict[str, Any] = dataclasses.field(default_factory=dict)  # where the compile time went


def cache_key(
    *,
    mode: str,
    model_config: dict[str, Any],
    precision: str,
    device: torch.device,
    extra: dict[str, Any] | None = None,
) -> str:
    """Compile artifacts are only reusable on the same torch/Triton/CUDA, the same GPU architecture, the same
    compile options and the same model; the key names all of them."""
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    gpu: dict[str, Any] = {}
    if device.type == "cuda":
        gpu = {
            "name": torch.cuda.get_device_name(device),
            "capability": list(torch.cuda.get_device_capability(device)),
            "cuda": torch.version.cuda,
        }
    payload = {
        "torch": torch.__version__,
        "triton": triton_version,
        "device": device.type,
        "gpu": gpu,
        "mode": mode,
        "precision": precision,
        "model": model_config,
        **(extra or {}),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


class _RssTree:
    """Host RSS of this process and its compile workers, cheaply.  ``psutil.Process.children(recursive=True)``
    walks every process in /proc; on the H200 host (gVisor) that took ~45 ms a call, and polled every 0.1 s
    the watcher thread held the GIL against Dynamo's tracing: 21.6 s of polling during a 31 s cold compile,
    3.8 s during an 8.2 s warm one (bench/results/compile_warm_probe.json).  The worker list is refreshed every
    ``refresh_s``; each poll reads only the known processes' RSS."""

    def __init__(self, refresh_s: float = 2.0) -> None:
        self.proc = psutil.Process()
        self.refresh_s = refresh_s
        self.children: list[psutil.Process] = []
        self.listed = -float("inf")

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self.listed >= self.refresh_s:
            with contextlib.suppress(psutil.Error):
                self.children = self.proc.children(recursive=True)  # Inductor's parallel compile workers
            self.listed = now
        total = self.proc.memory_info().rss
        for child in self.children:
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total


@contextlib.contextmanager
def _breaker(timeout_s: float, max_rss: int | None) -> Iterator[dict[str, Any]]:
    """Arm a SIGALRM for the time limit and a thread polling RSS; either trips ``_Trip`` in this thread."""
    rss_tree = _RssTree()
    state: dict[str, Any] = {"reason": None, "peak_rss": rss_tree(), "poll_s": 0.0}
    if max_rss is not None and state["peak_rss"] > max_rss:
        # Over the limit before compiling: the caller does not start (a trip raised into Dynamo mid-trace can
        # leave its C++ state broken: a CI run aborted with SIGABRT after one).
        state["reason"] = "FALLBACK_OOM_DETECTED"
    stop = threading.Event()
    main = threading.main_thread().ident

    def on_alarm(signum: int, frame: Any) -> None:
        if state["reason"] is None:
            state["reason"] = "FALLBACK_COMPILE_TIMEOUT"
        raise _Trip(state["reason"])

    def watch() -> None:
        interval = 0.1
        while not stop.wait(interval):
            t = time.perf_counter()
            rss = rss_tree()
            cost = time.perf_counter() - t
            state["poll_s"] += cost  # reported: time this thread competed with the compiler for the GIL
            interval = min(1.0, max(0.1, 20 * cost))  # at most ~5% of the time, and a reading every second
            state["peak_rss"] = max(state["peak_rss"], rss)
            if max_rss is not None and rss > max_rss and state["reason"] is None:
                state["reason"] = "FALLBACK_OOM_DETECTED"
                if main is not None:
                    signal.pthread_kill(main, signal.SIGALRM)
                return

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    watcher = threading.Thread(target=watch, name="kiln-compile-rss", daemon=True)
    watcher.start()
    try:
        yield state
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        stop.set()
        watcher.join()
        signal.signal(signal.SIGALRM, old)


def _is_unsupported(exc: BaseException) -> bool:
    import torch._dynamo.exc as dexc

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (dexc.Unsupported, dexc.UserError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _slow_backend(delay_s: float) -> Callable[..., Any]:
    """Test hook (TestHooks.compile_timeout): Inductor, after a stall longer than the breaker's limit."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        time.sleep(delay_s)
        return compile_fx(gm, example_inputs)

    return backend


class Compiler:
    def __init__(
        self,
        *,
        mode: str,
        timeout_s: float,
        max_rss_bytes: int | None,
        check_allclose: bool,
        cuda_graphs: bool,
        hooks: TestHooks,
        telemetry: Telemetry,
        device: torch.device,
        model_name: str,
        cache_dir: pathlib.Path | None,
        rank: int,
        world_size: int,
        group: Any,
    ) -> None:
        self.mode = mode
        self.timeout_s = timeout_s
        self.max_rss = 1 if hooks.compile_oom else max_rss_bytes
        self.check_allclose = check_allclose
        self.cuda_graphs = cuda_graphs  # decided by the trainer (trainer.loop.cuda_graphs_on)
        self.hooks = hooks
        self.tel = telemetry
        self.device = device
        self.model_name = model_name
        self.cache_dir = cache_dir
        self.rank, self.world_size, self.group = rank, world_size, group

    def _apply(self, model: nn.Module, blocks: list[nn.Module]) -> None:
        kwargs: dict[str, Any] = {"fullgraph": True, "dynamic": False}
        if self.cuda_graphs:
            kwargs["mode"] = "reduce-overhead"
        if self.hooks.compile_timeout:
            kwargs["backend"] = _slow_backend(self.timeout_s + 30.0)
        if self.mode == "regional":
            for block in blocks:
                block.compile(**kwargs)
        else:
            model.compile(**kwargs)

    @staticmethod
    def _revert(model: nn.Module) -> None:
        for m in model.modules():  # undo nn.Module.compile(): calls go back to the eager forward
            if getattr(m, "_compiled_call_impl", None) is not None:
                m._compiled_call_impl = None
        torch._dynamo.reset()

    def compile(
        self,
        model: nn.Module,
        blocks: list[nn.Module],
        *,
        loss_fn: Callable[[], torch.Tensor],
        precision: str,
        model_config: dict[str, Any],
        rtol: float,
        atol: float,
    ) -> CompileReport:
        """Compile ``model`` in place (on the bare module, before DDP/FSDP wrapping) or leave it eager."""
        report = CompileReport(mode=self.mode, active=False)
        if self.mode == "off":
            return report
        if self.hooks.unsupported_op:
            for b in blocks:
                b.inject_unsupported = True  # type: ignore[assignment]
        # The eager reference forward is the recipe's first run on the user's settings: what fails here is theirs.
        with torch.no_grad(), user_code("the first forward"):
            report.eager_loss = float(loss_fn().item())
        graphs = {"cuda_graphs": True} if self.cuda_graphs else None
        key = cache_key(
            mode=self.mode, model_config=model_config, precision=precision, device=self.device, extra=graphs
        )
        report.cache_key = key
        cache_file = self.cache_dir / f"{key}.bin" if self.cache_dir else None
        # torch's compiler modules were being imported in the background since start-up (compile_preload);
        # what is left of that is waited for here and reported, not counted as compile time.
        preload = compile_preload.wait()
        modules_before = set(sys.modules)
        # The compile time reported (and compared cold vs warm) includes loading the cached artifacts.
        t0 = time.perf_counter()
        marker = self.cache_dir / f"{key}.local" if self.cache_dir else None
        if (
            cache_file is not None
            and cache_file.is_file()
            and marker is not None
            and self._local_caches_here()
            and marker.is_file()
        ):
            # Inductor's and Triton's own caches in this directory already hold this graph (a run with this
            # key completed here): installing the portable artifacts again only rewrites the same entries
            # (1.8 s of the 6.6 s warm start on the H200).  If they were pruned, this is a cold compile.
            report.cache_hit = True
            report.cache_source = "local"
        elif cache_file is not None and cache_file.is_file():
            try:
                torch.compiler.load_cache_artifacts(cache_file.read_bytes())
                report.cache_hit = True
                report.cache_source = "artifacts"
            except Exception as exc:  # a bad cache costs a cold compile, nothing more
                self.tel.event(
                    "COMPILE_CACHE_INVALID", f"ignoring compile cache {cache_file.name}: {exc!r}", path=str(cache_file)
                )
        report.load_s = time.perf_counter() - t0
        self._apply(model, blocks)
        failure: str | None = None
        split: dict[str, float] = {}
        try:
            with _breaker(self.timeout_s, self.max_rss) as state, _in_process_kernels(report.cache_source == "local"):
                if state["reason"] is not None:
                    raise _Trip(state["reason"])
                t1 = time.perf_counter()
                loss = loss_fn()  # Dynamo traces (or its caches answer) here, then the forward runs
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                t2 = time.perf_counter()
                loss.backward()
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                split = {"first_forward_s": round(t2 - t1, 3), "first_backward_s": round(time.perf_counter() - t2, 3)}
            report.compiled_loss = float(loss.detach().item())
        except _Trip:
            failure = state["reason"]
        except Exception as exc:
            failure = state["reason"] or (
                "FALLBACK_UNSUPPORTED_OP" if _is_unsupported(exc) else "FALLBACK_COMPILE_ERROR"
            )
            report.error = f"{type(exc).__name__}: {str(exc)[:2000]}"
        report.elapsed_s = time.perf_counter() - t0
        report.phases = {
            **_compile_phases(),
            **(split if failure is None else {}),
            "rss_poll_s": round(state["poll_s"], 3),
            **preload,
        }
        report.peak_rss_bytes = int(state["peak_rss"])
        for p in model.parameters():
            p.grad = None
        if failure is None and self.check_allclose and report.compiled_loss is not None:
            ok = abs(report.compiled_loss - report.eager_loss) <= atol + rtol * abs(report.eager_loss)
            if not ok:
                failure = "FALLBACK_NUMERIC_MISMATCH"
        failure = self._agree(failure)
        if failure is not None:
            self._revert(model)
            if self.hooks.unsupported_op:
                for b in blocks:
                    b.inject_unsupported = False  # type: ignore[assignment]
            report.reason = failure
            self.tel.event(
                failure,
                f"compile fell back to eager: {failure}",
                model=self.model_name,
                graph=f"{self.mode}:{key}",
                elapsed_s=report.elapsed_s,
                timeout_s=self.timeout_s,
                peak_rss_bytes=report.peak_rss_bytes,
                max_rss_bytes=self.max_rss,
                device=str(self.device),
                device_name=_device_name(self.device),
                eager_loss=report.eager_loss,
                compiled_loss=report.compiled_loss,
                error=report.error,
            )
            return report
        report.active = True
        if cache_file is not None and not report.cache_hit and self.rank == 0:
            self._save_cache(cache_file)
        if self.rank == 0:
            compile_preload.record(modules_before, self.cache_dir)
        if marker is not None and self.rank == 0 and self._local_caches_here() and not marker.is_file():
            with contextlib.suppress(OSError):
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(json.dumps({"key": key, "created": time.time()}))
        self.tel.event(
            "COMPILE_OK",
            f"{self.mode} compile in {report.elapsed_s:.2f}s",
            model=self.model_name,
            graph=f"{self.mode}:{key}",
            elapsed_s=report.elapsed_s,
            peak_rss_bytes=report.peak_rss_bytes,
            cache_hit=report.cache_hit,
            cache_source=report.cache_source,
            load_s=report.load_s,
            phases=report.phases,
            eager_loss=report.eager_loss,
            compiled_loss=report.compiled_loss,
            device=str(self.device),
        )
        return report

    def _local_caches_here(self) -> bool:
        """Inductor's cache directory lives inside this compile-cache dir (trainer.loop keeps it there)."""
        raw = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if not raw or self.cache_dir is None:
            return False
        return pathlib.Path(raw).resolve().is_relative_to(self.cache_dir.resolve())

    def _agree(self, failure: str | None) -> str | None:
        if self.world_size == 1:
            return failure
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, failure, group=self.group)
        return next((f for f in everyone if f is not None), None)

    def _save_cache(self, cache_file: pathlib.Path) -> None:
        try:
            saved = torch.compiler.save_cache_artifacts()
            if saved is None:
                return
            blob, _info = saved
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=".cache-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.replace(tmp, cache_file)
        except Exception as exc:
            self.tel.event("COMPILE_CACHE_SAVE_FAILED", f"could not save compile cache: {exc!r}")


@contextlib.contextmanager
def _in_process_kernels(enabled: bool) -> Iterator[None]:
    """With the local Inductor/Triton caches known to hold this graph, there is nothing to compile: load the
    kernels in this process instead of starting Inductor's pool of compile workers (one per core, each
    importing torch) for them.  On the H200, warm whole-model 6.12 s with ``TORCHINDUCTOR_COMPILE_THREADS=1``
    vs 8.21 s with the pool (bench/results/compile_warm_probe.json).  A pruned cache still compiles, serially."""
    if not enabled:
        yield
        return
    import torch._inductor.config as inductor_config

    with inductor_config.patch(compile_threads=1):
        yield


def _compile_phases() -> dict[str, Any]:
    """Dynamo's per-phase compile seconds and the cache hit/miss counters: what a warm start still pays."""
    out: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # torch-internal: absent or renamed in some versions
        from torch._dynamo import utils as dutils

        metrics = getattr(dutils, "compilation_time_metrics", {})
        out["seconds"] = {k: round(sum(v), 3) for k, v in metrics.items() if v and sum(v) >= 0.01}
        out["counters"] = {
            f"{group}.{name}": n
            for group in ("inductor", "aot_autograd")
            for name, n in dutils.counters[group].items()
            if "cache" in name
        }
    return out


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
