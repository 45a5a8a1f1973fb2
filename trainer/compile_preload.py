"""Import torch's compiler stack in the background while the trainer does its other start-up work.

A first ``torch.compile`` call imports ~1,500-1,700 modules (Dynamo, AOTAutograd, Inductor, sympy, networkx)
and registers Inductor's custom ops: seconds of pure Python that a warm start from the compile cache pays
just like a cold one.  None of it depends on the model, so it can run while the main thread waits for the
rendezvous, builds the model, sets up the data and runs the eager reference step; by the time the compiler
is called it is loaded.

What to import: a fixed core (the three entry points below) and, once a compile has succeeded with this
cache directory, the exact list of modules that compile imported (``preload-modules.json`` beside the compile
artifacts, written by rank 0): device-specific code generators, FX passes and runtime helpers that only load
on first use.  A name that no longer imports (another torch version) is skipped; any failure here only means
the compiler imports it itself, later, as it would have without this.

One preload per process (imports are process-wide): ``start()`` early, ``wait()`` before compiling.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pathlib
import sys
import tempfile
import threading
import time

CORE = ("torch._dynamo", "torch._functorch.aot_autograd", "torch._inductor.compile_fx")
MODULES_FILE = "preload-modules.json"
# Only modules of installed packages are worth recording: Inductor's generated kernels (random names, loaded
# from the cache directory) and anything of this process's own are not.
_PACKAGES = ("torch", "triton", "sympy", "networkx", "mpmath", "filelock", "jinja2", "numpy")


class _Preload:
    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.imported = 0
        self.failed = 0
        self.elapsed_s = 0.0
        self.thread = threading.Thread(target=self._run, name="kiln-compiler-import", daemon=True)

    def _run(self) -> None:
        t = time.perf_counter()
        for name in self.names:
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
                self.imported += 1
            except BaseException:  # noqa: BLE001 - the compiler will import (or fail on) it itself, later
                self.failed += 1
        self.elapsed_s = time.perf_counter() - t


_active: _Preload | None = None
_lock = threading.Lock()


def start(cache_dir: pathlib.Path | None) -> None:
    """Begin importing in a daemon thread (once per process; later calls do nothing)."""
    global _active
    with _lock:
        if _active is not None:
            return
        _active = _Preload([*CORE, *recorded(cache_dir)])
        _active.thread.start()


def wait() -> dict[str, float | int]:
    """Block until the preload is done; returns what it did and how long this call blocked (0 without one)."""
    with _lock:
        active = _active
    if active is None:
        return {"preload_wait_s": 0.0}
    t = time.perf_counter()
    active.thread.join()
    return {
        "preload_wait_s": round(time.perf_counter() - t, 3),
        "preload_s": round(active.elapsed_s, 3),
        "preload_modules": active.imported,
        "preload_failed": active.failed,
    }


def recorded(cache_dir: pathlib.Path | None) -> list[str]:
    if cache_dir is None:
        return []
    try:
        names = json.loads((cache_dir / MODULES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def record(before: set[str], cache_dir: pathlib.Path | None) -> None:
    """After a successful compile: save the package modules it imported (in import order), for the next start."""
    if cache_dir is None:
        return
    new = [name for name in list(sys.modules) if name not in before and name.split(".")[0] in _PACKAGES]
    known = recorded(cache_dir)
    seen = set(known)
    names = [*known, *(n for n in new if n not in seen)]
    if not new or names == known:
        return
    with contextlib.suppress(OSError):
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".preload-")
        with os.fdopen(fd, "w") as fh:
            json.dump(names, fh)
        os.replace(tmp, cache_dir / MODULES_FILE)
