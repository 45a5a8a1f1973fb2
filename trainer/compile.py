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
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from core import compile_cache as store
from core.telemetry import Telemetry
from core.trainer_protocol import COMPILER_CACHE_ENV
from trainer import compile_preload
from trainer.cache_tiers import Loaded, Tiers, cache_fields, forget_recorded_artifacts
from trainer.compile_breaker import Trip, breaker
from trainer.config import TestHooks
from trainer.user_error import user_code

LOCAL = "local"  # a hit from the job's own Inductor/Triton dirs (the other sources: cache_tiers.TEAM, SHARED)


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
    cache_source: str | None = None  # "local" (the job's own Inductor dirs), "team" or "shared" (cache_tiers)
    load_s: float = 0.0  # reading, checking and installing cached artifacts (part of elapsed_s)
    saved_s: float | None = None  # a hit: the cold compile time recorded with the entry, minus this compile's
    phases: dict[str, Any] = dataclasses.field(default_factory=dict)  # where the compile time went


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


def _unsupported_op(block: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Test hook (TestHooks.unsupported_op), run before each block's forward: a data-dependent Python branch, which
    Dynamo cannot put in one graph; with fullgraph=True the compile fails the way a genuinely unsupported op does.
    The branch is never taken on real activations, so the eager model computes what it would without the hook."""
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and x.sum().item() > 1e30:
        return (x * 2.0, *args[1:])
    return None


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
        strategy: str = "single",
        tiers: Tiers | None = None,
        triton_gemms: bool = False,
    ) -> None:
        self.mode = mode
        self.timeout_s = timeout_s
        self.max_rss = 1 if hooks.compile_oom else max_rss_bytes
        self.check_allclose = check_allclose
        self.cuda_graphs = cuda_graphs  # decided by the trainer (trainer.builders.cuda_graphs_on)
        self.hooks = hooks
        self.tel = telemetry
        self.device = device
        self.model_name = model_name
        self.cache_dir = cache_dir
        self.rank, self.world_size, self.group = rank, world_size, group
        self.strategy = strategy
        self.tiers = tiers if tiers is not None else Tiers.from_env(cache_dir)
        # GEMMs through Triton because cuBLAS's are wrong here (trainer.gemm_check): part of the key, and the
        # first backward's gradients must come out finite (a GEMM left on cuBLAS would make NaNs).
        self.triton_gemms = triton_gemms
        self.poll_s = 0.0
        self._fault_hooks: list[torch.utils.hooks.RemovableHandle] = []  # TestHooks.unsupported_op, while on

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
            self._fault_hooks = [b.register_forward_pre_hook(_unsupported_op) for b in blocks]
        # The eager reference forward is the recipe's first run on the user's settings: what fails here is theirs.
        with torch.no_grad(), user_code("the first forward"):
            report.eager_loss = float(loss_fn().item())
        fields = cache_fields(
            mode=self.mode,
            model_config=model_config,
            precision=precision,
            device=self.device,
            world_size=self.world_size,
            strategy=self.strategy,
            extra=self._key_options(),
        )
        report.cache_key = key = store.key_of(fields)
        # torch's compiler modules were being imported in the background since start-up (compile_preload);
        # what is left of that is waited for here and reported, not counted as compile time.
        preload = compile_preload.wait()
        modules_before = set(sys.modules)
        # The compile time reported (and compared cold vs warm) includes loading the cached artifacts.
        t0 = time.perf_counter()
        loaded, cold_s = self._lookup(key, report)
        failure, state = self._run(model, loss_fn, blocks, report)
        # Cached code is trusted only once it runs and computes eager's loss on the first batch, whatever the spec
        # says: an entry that fails either is rejected and the model compiled afresh (not trained eager).
        if self._anyone(report.cache_hit and failure is not None):
            reason = f"the cached compile failed to run: {failure}: {report.error or 'on another rank'}"
            failure, state = self._refuse(loaded, model, blocks, loss_fn, report, reason=reason, check="run")
        elif self._anyone(report.cache_hit and not _close(report, rtol, atol)):
            reason = f"numeric mismatch: compiled loss {report.compiled_loss} vs eager {report.eager_loss}"
            failure, state = self._refuse(loaded, model, blocks, loss_fn, report, reason=reason, check="numeric")
        report.elapsed_s = time.perf_counter() - t0
        report.phases = {**_compile_phases(), **report.phases, "rss_poll_s": round(self.poll_s, 3), **preload}
        for p in model.parameters():
            p.grad = None
        if failure is None and self.check_allclose and not _close(report, rtol, atol):
            failure = "FALLBACK_NUMERIC_MISMATCH"
        failure = self._agree(failure)
        if failure is not None:
            self._fall_back(model, blocks, report, failure)
            return report
        report.active = True
        if report.cache_hit and cold_s is not None:
            report.saved_s = round(cold_s - report.elapsed_s, 3)
        self._keep(report, fields, cold_s if report.cache_hit else report.elapsed_s, modules_before)
        self._report_ok(report)
        return report

    def _key_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"cuda_graphs": True} if self.cuda_graphs else {}
        if self.device.type == "cuda" and portable_kernels():
            options["kernel_binaries"] = True  # entries from before kernels kept their binaries do not match
        if self.triton_gemms:
            options["gemm_backends"] = "TRITON"
        return options

    def _lookup(self, key: str, report: CompileReport) -> tuple[Loaded | None, float | None]:
        """Install the cached artifacts for ``key``, if any: the job's own caches (``{key}.local``), else the
        team's tier, else the shared one. Returns the tier's entry loaded and the cold compile time it saves."""
        forget_recorded_artifacts()
        t0 = time.perf_counter()
        loaded: Loaded | None = None
        marker = self._marker(key)
        if marker is not None and marker.is_file() and self._local_caches_here():
            # Inductor's and Triton's own caches in this directory already hold this graph (a run with this
            # key completed here): installing the portable artifacts again only rewrites the same entries
            # (1.8 s of the 6.6 s warm start on the H200).  If they were pruned, this is a cold compile.
            report.cache_hit, report.cache_source = True, LOCAL
            cold_s = _marker_cold_s(marker)
        else:
            loaded = self.tiers.load(key, self.tel)
            if loaded is not None:
                report.cache_hit, report.cache_source = True, loaded.source
            cold_s = loaded.entry.cold_compile_s if loaded is not None else None
        report.load_s = time.perf_counter() - t0
        return loaded, cold_s

    def _run(
        self, model: nn.Module, loss_fn: Callable[[], torch.Tensor], blocks: list[nn.Module], report: CompileReport
    ) -> tuple[str | None, dict[str, Any]]:
        """Compile and run the first forward and backward behind the breaker; the FALLBACK_* reason, if any."""
        self._apply(model, blocks)
        failure: str | None = None
        try:
            with breaker(self.timeout_s, self.max_rss) as state, _in_process_kernels(report.cache_source == LOCAL):
                if state["reason"] is not None:
                    raise Trip(state["reason"])
                t1 = time.perf_counter()
                loss = loss_fn()  # Dynamo traces (or its caches answer) here, then the forward runs
                self._sync()
                t2 = time.perf_counter()
                loss.backward()
                self._sync()
            if self.triton_gemms and not _finite_grads(model):
                raise Trip("FALLBACK_NUMERIC_MISMATCH")
            report.phases = {
                "first_forward_s": round(t2 - t1, 3),
                "first_backward_s": round(time.perf_counter() - t2, 3),
            }
            report.compiled_loss = float(loss.detach().item())
        except Trip as trip:
            failure = state["reason"] or str(trip)
            if failure == "FALLBACK_NUMERIC_MISMATCH":
                report.error = "non-finite gradients from the compiled backward's Triton GEMMs"
        except Exception as exc:
            failure = state["reason"] or (
                "FALLBACK_UNSUPPORTED_OP" if _is_unsupported(exc) else "FALLBACK_COMPILE_ERROR"
            )
            report.error = f"{type(exc).__name__}: {str(exc)[:2000]}"
        self.poll_s += state["poll_s"]
        report.peak_rss_bytes = max(report.peak_rss_bytes, int(state["peak_rss"]))
        if failure is not None:
            report.phases = {}
        return failure, state

    def _refuse(
        self,
        loaded: Loaded | None,
        model: nn.Module,
        blocks: list[nn.Module],
        loss_fn: Callable[[], torch.Tensor],
        report: CompileReport,
        *,
        reason: str,
        check: str,
    ) -> tuple[str | None, dict[str, Any]]:
        """A cached compile that failed to run, or whose first loss is not eager's (on some rank): the entry is
        rejected and discarded, the job's own compiler caches (which loading it filled) purged, and the model
        compiled afresh. Every rank purges before any compiles again (two agreements), so none compiles into a
        directory being renamed away."""
        source = report.cache_source
        if loaded is not None:
            self.tiers.reject(self.tel, loaded, reason, check=check)
        elif source == LOCAL and report.cache_key is not None:
            self.tel.event(
                "COMPILE_CACHE_REJECTED",
                f"the job's own compiler caches rejected: {reason}",
                cache_key=report.cache_key,
                cache_source=LOCAL,
                reason=reason,
                check=check,
                discarded=True,
            )
        self._revert(model)
        for p in model.parameters():
            p.grad = None
        purged = self._purge_local_caches(report.cache_key)
        self._anyone(False)  # every rank has purged
        report.cache_hit, report.cache_source, report.compiled_loss, report.error = False, None, None, None
        forget_recorded_artifacts()
        import torch._inductor.config as inductor_config

        # Where the caches could not be purged (they are not kiln's), the fresh compile bypasses them instead.
        with contextlib.nullcontext() if purged else inductor_config.patch(force_disable_caches=True):
            return self._run(model, loss_fn, blocks, report)

    def _purge_local_caches(self, key: str | None) -> bool:
        """Rename the job's Inductor and Triton caches aside and delete them, with the ``.local`` marker."""
        if not self._local_caches_here() or self.cache_dir is None:
            return False
        if key is not None:
            with contextlib.suppress(OSError):
                self._marker(key).unlink(missing_ok=True)  # type: ignore[union-attr]
        for var in COMPILER_CACHE_ENV:
            raw = os.environ.get(var)
            if not raw:
                continue
            path = pathlib.Path(raw)
            store.discard(path.parent, path.name)  # False: another rank was first
        return True

    def _fall_back(self, model: nn.Module, blocks: list[nn.Module], report: CompileReport, failure: str) -> None:
        self._revert(model)
        for handle in self._fault_hooks:
            handle.remove()
        self._fault_hooks = []
        report.reason = failure
        self.tel.event(
            failure,
            f"compile fell back to eager: {failure}",
            model=self.model_name,
            graph=f"{self.mode}:{report.cache_key}",
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

    def _keep(self, report: CompileReport, fields: dict[str, Any], cold_s: float | None, before: set[str]) -> None:
        """Rank 0 keeps what the next compile needs: a miss's artifacts for the team, the modules to preload and
        the ``.local`` marker (with the cold compile time, so a warm restart can say what it saved)."""
        if self.rank != 0:
            return
        if not report.cache_hit:
            self.tiers.publish(fields, report.elapsed_s, self.tel)
        compile_preload.record(before, self.cache_dir)
        marker = self._marker(report.cache_key) if report.cache_key else None
        if marker is not None and self._local_caches_here() and not marker.is_file():
            with contextlib.suppress(OSError):
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(
                    json.dumps({"key": report.cache_key, "created": time.time(), "cold_compile_s": cold_s})
                )

    def _report_ok(self, report: CompileReport) -> None:
        self.tel.event(
            "COMPILE_OK",
            f"{self.mode} compile in {report.elapsed_s:.2f}s",
            model=self.model_name,
            graph=f"{self.mode}:{report.cache_key}",
            elapsed_s=report.elapsed_s,
            peak_rss_bytes=report.peak_rss_bytes,
            cache_hit=report.cache_hit,
            cache_source=report.cache_source,
            cache_key=report.cache_key,
            load_s=report.load_s,
            saved_s=report.saved_s,
            phases=report.phases,
            eager_loss=report.eager_loss,
            compiled_loss=report.compiled_loss,
            device=str(self.device),
        )

    def _marker(self, key: str) -> pathlib.Path | None:
        return self.cache_dir / f"{key}.local" if self.cache_dir else None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _local_caches_here(self) -> bool:
        """Inductor's cache directory lives inside this compile-cache dir (trainer.builders keeps it there)."""
        raw = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if not raw or self.cache_dir is None:
            return False
        return pathlib.Path(raw).resolve().is_relative_to(self.cache_dir.resolve())

    def _anyone(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is on any (a collective on the control group when distributed)."""
        return self._agree("on" if flag else None) is not None

    def _agree(self, failure: str | None) -> str | None:
        if self.world_size == 1:
            return failure
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, failure, group=self.group)
        return next((f for f in everyone if f is not None), None)


def portable_kernels() -> bool:
    """Whether Inductor keeps each statically launched Triton kernel's binary (cubin) in the compiled graph it
    caches (``keep_static_cubin_raw``, torch >= 2.13; ``trainer.builders.persist_compiler_caches`` turns it on).

    By default Inductor drops the bytes and, on a cache hit, expects the kernel's file in the local Triton cache,
    which another host lacks: the load would raise "Cubin file saved by TritonBundler not found". With the bytes
    kept, Inductor writes them into this job's own Triton cache. (The H100's failed hits had another cause, a
    recorded path into the compiling job's directory: ``workers.attempt_setup.COMPILE_DIR_IN_SANDBOX``; the first
    GPU hit ran with both mends.) A part of the key: an entry without the binaries never matches one with them.
    """
    import torch._inductor.config as inductor_config

    return bool(getattr(inductor_config, "keep_static_cubin_raw", False))


def _finite_grads(model: nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.stack([g.isfinite().all() for g in grads]).all()) if grads else True


def _close(report: CompileReport, rtol: float, atol: float) -> bool:
    """The compiled first-step loss is eager's within the precision's tolerance."""
    if report.compiled_loss is None or report.eager_loss is None:
        return True  # nothing to compare: the compile failed, and says so itself
    return abs(report.compiled_loss - report.eager_loss) <= atol + rtol * abs(report.eager_loss)


def _marker_cold_s(marker: pathlib.Path) -> float | None:
    try:
        value = json.loads(marker.read_text()).get("cold_compile_s")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


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
