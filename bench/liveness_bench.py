"""How long the container healthcheck's command takes: ``python -m core.liveness`` on a fresh beat, run again and again.

The compose file runs it every few seconds in the scheduler's and the worker's containers (docs/deploy.md), so it must
stay cheap: a process start and one small file read, 0.05-0.07 s on the 2-core CI box when a test asserted under
2 s. That wall-clock bound lives here, out of the tests (tests/e2e/test_liveness_command.py checks what it says).

    .venv/bin/python bench/liveness_bench.py              # 20 runs; prints the median and the slowest
    .venv/bin/python bench/liveness_bench.py --runs 100
    .venv/bin/python bench/liveness_bench.py --smoke      # 3 runs, no bound: that it runs (CI)

JSON to ``--out`` (bench/results/liveness_bench.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.liveness import Pulse  # noqa: E402

BOUND_S = 2.0  # the healthcheck's own budget is seconds; far under it is what "cheap" means here


def one_check(path: Path) -> float:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "KILN_LIVENESS_FILE": str(path)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "core.liveness"], capture_output=True, text=True, env=env)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"liveness_bench: the check failed: {done.stdout}{done.stderr}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="3 runs and no bound: that it runs (CI)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "liveness_bench.json")
    args = ap.parse_args()
    if args.smoke:
        args.runs = 3
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "alive.json"
        Pulse(path, 10.0).beat("heartbeat")
        times = [one_check(path) for _ in range(args.runs)]
    median, slowest = statistics.median(times), max(times)
    result = {
        "smoke": args.smoke,
        "runs": args.runs,
        "median_s": round(median, 4),
        "max_s": round(slowest, 4),
        "bound_s": BOUND_S,
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg()[0],
    }
    text = json.dumps(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 0 if args.smoke or slowest < BOUND_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
