"""Where a warm compile's time goes (the target: a warm compile from the cache takes <= 20% of a cold one).

Each measurement is its own fresh process running kiln's ``trainer.compile.Compiler`` on the same model,
batch and precision as ``bench/trainer_bench.py`` (GPT-2 124M, 32 x 1024, bf16 on a GPU), with the compile
cache in a directory of its own: ``cold`` starts from an empty one, ``warm`` reuses what ``cold`` left.  The
figure is the Compiler's ``elapsed_s``, the same for both: from the cache lookup to the end of the first
compiled forward + backward (synchronised), minus nothing.  Beside it each child reports:

* ``first_forward_s`` / ``first_backward_s``: the first compiled call (Dynamo, or its caches, then the
  forward) and the first backward, each synchronised;
* Dynamo's per-phase seconds and the Inductor / AOTAutograd cache counters, and ``recompiles``;
* ``second_step_s``: a second forward + backward, i.e. what the same work costs once everything is set up;
* process start-up (``import_s``, ``cuda_init_s``, ``model_s``), outside the figure in both phases;
* ``preload_wait_s``: how long the compile waited for the background import of torch's compiler modules
  (``trainer.compile_preload``, started before CUDA init as ``python -m trainer`` does; outside the figure);
* ``ready_s``: process start to the first compiled step done: everything a restarted attempt waits for;
* with ``--profile``: the top functions of a cProfile of the compile (cumulative and own time).

Variants (``--variants``, comma-separated):

* ``whole`` / ``regional``: kiln's compile modes, cold then warm;
* ``whole_profile``: one more warm whole-model start, under cProfile (its time is inflated; shares only);
* ``whole_nopreload``: cold + warm without ``trainer.compile_preload`` (the compile imports torch's compiler
  modules itself, inside the figure), the same-run baseline of what the preload saves;
* ``whole_precompile``: cold + warm with Dynamo's caching precompile (``TORCH_CACHING_PRECOMPILE=1``),
  where this torch has it: a warm start then reuses Dynamo's bytecode and guards instead of re-tracing.

Run: ``python bench/compile_warm_probe.py [--smoke] [--out bench/results/compile_warm_probe.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

T_START = time.perf_counter()
ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
PYPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def sizes(smoke: bool) -> dict[str, Any]:
    if smoke:
        return {"size": "tiny", "corpus": "synthetic", "batch_size": 4, "seq_len": 64, "n_layer": 1}
    return {"size": "gpt2", "corpus": "synthetic", "batch_size": 32, "seq_len": 1024}


def child(args: argparse.Namespace) -> None:
    """One fresh process: kiln's Compiler on the bench model, timed; prints one JSON line."""
    import torch

    t_import = time.perf_counter()
    from core.telemetry import Telemetry
    from trainer.builders import ALLCLOSE, persist_compiler_caches
    from trainer.compile import Compiler
    from trainer.config import TestHooks
    from trainer.precision import PrecisionContext, resolve
    from trainer.recipes.gpt import GPTRecipe

    cache = pathlib.Path(args.cache)
    persist_compiler_caches(cache)  # Inductor's and Triton's caches inside the kiln cache dir, as the trainer does
    if not args.no_preload:  # as python -m trainer: the compiler's modules load while the model is built
        from trainer import compile_preload

        compile_preload.start(cache)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.init()
        torch.ones(1, device=device).sum().item()
    t_cuda = time.perf_counter()
    recipe = GPTRecipe(sizes(args.smoke))
    torch.manual_seed(0)
    model = recipe.build_model().to(device)
    prec = PrecisionContext.create(resolve("auto", device), device)
    batch = recipe.batch_to(recipe.make_data(rank=0, world_size=1, seed=0).batch(0), device)
    t_model = time.perf_counter()

    def loss_fn() -> torch.Tensor:
        with prec.autocast():
            return recipe.loss(model, batch)

    tel = Telemetry(tempfile.mkdtemp(prefix="kiln-probe-tel-"), 0)
    compiler = Compiler(
        mode=args.mode,
        timeout_s=900,
        max_rss_bytes=None,
        check_allclose=True,
        cuda_graphs=False,
        hooks=TestHooks(),
        telemetry=tel,
        device=device,
        model_name="gpt",
        cache_dir=cache,
        rank=0,
        world_size=1,
        group=None,
    )
    rtol, atol = ALLCLOSE[prec.precision]
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    report = compiler.compile(
        model,
        recipe.compile_regions(model),
        loss_fn=loss_fn,
        precision=prec.precision,
        model_config=recipe.graph_config(),
        rtol=rtol,
        atol=atol,
    )
    if prof is not None:
        prof.disable()
    t2 = time.perf_counter()
    ready_s = t2 - T_START
    loss_fn().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    second = time.perf_counter() - t2
    from torch._dynamo.utils import counters

    out: dict[str, Any] = {
        "mode": args.mode,
        "active": report.active,
        "reason": report.reason,
        "error": report.error,
        "elapsed_s": report.elapsed_s,
        "cache_hit": report.cache_hit,
        "cache_source": report.cache_source,
        "load_s": report.load_s,
        "phases": report.phases,
        "second_step_s": round(second, 3),
        "recompiles": dict(counters["recompiles"]),
        "unique_graphs": counters["stats"].get("unique_graphs"),
        "import_s": round(t_import - T_START, 3),
        "cuda_init_s": round(t_cuda - t0, 3),
        "model_s": round(t_model - t_cuda, 3),
        "eager_loss": report.eager_loss,
        "compiled_loss": report.compiled_loss,
        "torch": torch.__version__,
        "caching_precompile": bool(getattr(torch._dynamo.config, "caching_precompile", False)),
        "compile_threads": torch._inductor.config.compile_threads,
        "ready_s": round(ready_s, 3),
        "preload": not args.no_preload,
        "bytecode": _bytecode_state(torch),
    }
    if prof is not None:
        import pstats

        rows: dict[str, list[Any]] = {}
        stats = pstats.Stats(prof)
        for key in ("cumulative", "tottime"):
            entries = sorted(
                stats.stats.items(),
                key=lambda kv: kv[1][3] if key == "cumulative" else kv[1][2],  # type: ignore[attr-defined]
                reverse=True,
            )[:40]
            rows[key] = [
                [f"{pathlib.Path(f).name}:{line}:{fn}", round(tt, 3), round(ct, 3), nc]
                for (f, line, fn), (_cc, nc, tt, ct, _callers) in entries
            ]
        out["profile"] = rows
    print(json.dumps(out, default=str))


def _bytecode_state(torch: Any) -> dict[str, Any]:
    """Whether this torch's modules load from cached bytecode: an install without .pyc files in a read-only
    directory recompiles every imported module's source in every process (start-up cost, cold and warm)."""
    pkg = pathlib.Path(torch.__file__).parent / "_dynamo"
    return {
        "pycache": (pkg / "__pycache__").is_dir() and any((pkg / "__pycache__").iterdir()),
        "writable": os.access(pkg, os.W_OK),
        "dont_write": sys.dont_write_bytecode,
        "prefix": sys.pycache_prefix,
    }


def run_child(
    mode: str,
    cache: pathlib.Path,
    *,
    smoke: bool,
    env_extra: dict[str, str] | None = None,
    profile: bool = False,
    timeout: float = 900,
    preload: bool = True,
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--cache", str(cache)]
    cmd += ["--smoke"] if smoke else []
    cmd += [] if preload else ["--no-preload"]
    cmd += ["--profile"] if profile else []
    env = {
        **os.environ,
        "PYTHONPATH": PYPATH,
        "TORCHINDUCTOR_CACHE_DIR": "",
        "TRITON_CACHE_DIR": "",
        **(env_extra or {}),
    }
    for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # the trainer puts them inside the kiln dir
        if not env[k]:
            del env[k]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": f"rc={proc.returncode}: {proc.stderr[-3000:]}", "process_wall_s": wall}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = round(wall, 2)
    return res


def summary_line(name: str, r: dict[str, Any]) -> str:
    if "elapsed_s" not in r:
        return f"{name:28s} FAILED {r.get('error', '')[:300]}"
    ph = r.get("phases") or {}
    sec = ph.get("seconds") or {}
    return (
        f"{name:28s} elapsed={r['elapsed_s']:7.2f}s fwd1={ph.get('first_forward_s')} "
        f"bwd1={ph.get('first_backward_s')} dynamo={sec.get('_compile.compile_inner')} "
        f"trace={sec.get('bytecode_tracing')} user_compiler={sec.get('OutputGraph.call_user_compiler')} "
        f"bw_compile={sec.get('compile_fx.<locals>.bw_compiler')} step2={r.get('second_step_s')} "
        f"hit={r.get('cache_hit')}/{r.get('cache_source')} rss_poll={ph.get('rss_poll_s')} "
        f"counters={ph.get('counters')} recompiles={r.get('recompiles')} active={r.get('active')}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", default="whole")
    ap.add_argument("--cache", default="")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-preload", action="store_true", help="child: let the compile import the compiler itself")
    ap.add_argument("--variants", default="whole,whole_nopreload,regional,whole_profile")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "compile_warm_probe.json"))
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    work = pathlib.Path(tempfile.mkdtemp(prefix="kiln-compile-probe-"))
    results: dict[str, Any] = {}

    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def record(name: str, r: dict[str, Any]) -> None:
        results[name] = r
        print(summary_line(name, r), flush=True)
        out.write_text(json.dumps({"runs": results, "smoke": args.smoke}, indent=1, default=str))  # partial

    variants = args.variants.split(",")
    runs = [
        ("whole", "whole", {}, True),
        ("regional", "regional", {}, True),
        ("whole_nopreload", "whole", {}, False),
        ("whole_precompile", "whole", {"TORCH_CACHING_PRECOMPILE": "1"}, True),
    ]
    for name, mode, env, preload in runs:
        if name not in variants:
            continue
        cache = work / f"cache-{name}"
        record(f"{name}_cold", run_child(mode, cache, smoke=args.smoke, env_extra=env, preload=preload))
        record(f"{name}_warm", run_child(mode, cache, smoke=args.smoke, env_extra=env, preload=preload))
        if name == "whole" and "whole_profile" in variants:
            record("whole_warm_profile", run_child(mode, cache, smoke=args.smoke, profile=True))

    def pair(name: str) -> dict[str, Any]:
        cold, warm = results.get(f"{name}_cold", {}), results.get(f"{name}_warm", {})

        def ratio(key: str) -> float | None:
            c, w = cold.get(key), warm.get(key)
            return round(w / c, 4) if c and w else None

        return {
            "cold_s": cold.get("elapsed_s"),
            "warm_s": warm.get("elapsed_s"),
            "warm_over_cold": ratio("elapsed_s"),
            "preload_wait_s": [(r.get("phases") or {}).get("preload_wait_s") for r in (cold, warm)],
            "ready_cold_s": cold.get("ready_s"),
            "ready_warm_s": warm.get("ready_s"),
            "ready_warm_over_cold": ratio("ready_s"),
        }

    summary = {
        **{name: pair(name) for name, *_ in runs if name in variants},
        "target": "warm <= 0.20 x cold (elapsed_s: cache lookup -> first compiled step done)",
    }
    print(json.dumps(summary, indent=1), flush=True)
    out.write_text(json.dumps({"summary": summary, "runs": results, "smoke": args.smoke}, indent=1, default=str))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
