"""What the sandbox costs a job, on the path a user takes: the same shipped example through ``kiln up``, once with the
sandbox turned off (``KILN_ISOLATION=none``, the baseline) and once as kiln runs by default (every attempt in its
bubblewrap sandbox, as its team's uid), in one run on one host.

    python3 bench/sandbox_bench.py --example gpt     # GPU: examples/gpt2-124m-h200.yaml as shipped
    python3 bench/sandbox_bench.py --example user    # GPU: examples/gpt-user (the team's own model, uploaded)
    python3 bench/sandbox_bench.py --smoke           # CPU: examples/gpt-tiny.yaml and examples/digits, for CI

For each example and each mode, in the order given (``--order``, default baseline first): ``./kiln up --detach`` on a
new KILN_HOME, the example submitted with ``./kiln submit`` (``--workdir`` for a team's code) and followed to its
end, ``./kiln down``. Measured from the trainer's own telemetry of the one attempt: throughput (``tokens_per_s_run``:
first step to final durable save, checkpoints included; the median step), and the start-up: from the worker's
launch of the attempt (``launched_ts``, before bubblewrap sets anything up) to the rank's first line of Python
(``process_start_ts``) and to its first step's record. The ratios are sandboxed / baseline. JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import socket
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from gpu_path_bench import Kiln, log, run_summary  # noqa: E402  (one driver of ./kiln for the benches)

EXAMPLES = {
    "gpt": (ROOT / "examples" / "gpt2-124m-h200.yaml", None),
    "user": (ROOT / "examples" / "gpt-user" / "job.yaml", ROOT / "examples" / "gpt-user"),
    "tiny": (ROOT / "examples" / "gpt-tiny.yaml", None),
    "digits": (ROOT / "examples" / "digits" / "job.yaml", ROOT / "examples" / "digits"),
}
MODES = {"baseline": {"KILN_ISOLATION": "none"}, "sandboxed": {}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(example: str, mode: str, warmup: int) -> dict[str, Any]:
    spec, workdir = EXAMPLES[example]
    home = pathlib.Path(tempfile.mkdtemp(prefix=f"kiln-sandbox-{mode}-"))
    kiln = Kiln(home, free_port())
    kiln.env.pop("KILN_ISOLATION", None)
    kiln.env.update(MODES[mode])
    kiln.up()
    try:
        spec, rewritten = for_this_host(kiln, spec, home)
        args = ["submit", str(spec), "--output", "json"] + (["--workdir", str(workdir)] if workdir else [])
        done = kiln.cli(*args)
        if done.returncode != 0:
            raise RuntimeError(f"submit failed: {done.stdout}{done.stderr}")
        job_id = int(json.loads(done.stdout)["id"])
        job = kiln.wait(job_id, lambda j: j["state"] == "SUCCEEDED", 1800, "the end")
        recs = kiln.telemetry(job_id, 1)
        log_text = (home / "storage" / "logs" / str(job_id) / "1.log").read_text()
    finally:
        kiln.cli("down")
    started = next(r for r in recs if r.get("type") == "STARTED")["fields"]
    first_step = next(r for r in recs if r["kind"] == "step")
    launched, process = started.get("launched_ts"), started.get("process_start_ts")
    return {
        "job": job_id,
        "gpu_type_rewritten": rewritten,
        "final_loss": job.get("last_loss"),
        "sandboxed_in_log": "inside its bubblewrap sandbox" in log_text,
        "launch_to_process_s": process - launched if launched and process else None,
        "launch_to_first_step_s": first_step["ts"] - launched if launched else None,
        **run_summary(recs, warmup),
    }


def for_this_host(kiln: Kiln, spec: pathlib.Path, home: pathlib.Path) -> tuple[pathlib.Path, str | None]:
    """The example as shipped, or, where it names a GPU type this host lacks (the GPU examples name H200; the lent
    host may be an H100), a copy naming the host's type: the one line changed, and said in the results."""
    text = spec.read_text()
    named = re.search(r"^(\s*gpu_type:\s*)(\S+)\s*$", text, re.M)
    gpus = kiln.get("/v1/cluster/gpus")["items"]
    if named is None or not gpus or gpus[0]["model"] == named.group(2):
        return spec, None
    copy = home / spec.name
    copy.write_text(text[: named.start(2)] + gpus[0]["model"] + text[named.end(2) :])
    return copy, f"{named.group(2)} -> {gpus[0]['model']}"


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def compare(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    base, box = runs["baseline"], runs["sandboxed"]
    return {
        "tokens_per_s_run": ratio(box["tokens_per_s_run"], base["tokens_per_s_run"]),
        "tokens_per_s_median_step": ratio(box["tokens_per_s_median_step"], base["tokens_per_s_median_step"]),
        "start_up_extra_s": (
            round(box["launch_to_first_step_s"] - base["launch_to_first_step_s"], 3)
            if box["launch_to_first_step_s"] is not None and base["launch_to_first_step_s"] is not None
            else None
        ),
        "sandbox_set_up_extra_s": (
            round(box["launch_to_process_s"] - base["launch_to_process_s"], 3)
            if box["launch_to_process_s"] is not None and base["launch_to_process_s"] is not None
            else None
        ),
        # bf16 on a GPU is not bit-for-bit between runs (atomics, autotuning): the same to 1e-4 relative
        "same_final_loss": bool(base["final_loss"] and box["final_loss"])
        and abs(box["final_loss"] - base["final_loss"]) <= 1e-4 * abs(base["final_loss"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", action="append", choices=sorted(EXAMPLES), help="repeatable")
    ap.add_argument("--smoke", action="store_true", help="CPU: examples/gpt-tiny.yaml and examples/digits")
    ap.add_argument("--order", default="baseline,sandboxed", help="the modes, in the order they run")
    ap.add_argument("--warmup", type=int, default=20, help="steps left out of the median step")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args()
    examples = args.example or (["tiny", "digits"] if args.smoke else ["gpt", "user"])
    out = args.out or ROOT / "bench" / "results" / ("sandbox_bench_smoke.json" if args.smoke else "sandbox_bench.json")
    result: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "examples": {}}
    for example in examples:
        runs = {}
        for mode in args.order.split(","):
            log(f"{example}: {mode}")
            runs[mode] = one_run(example, mode, 5 if args.smoke else args.warmup)
            shown = {k: runs[mode][k] for k in ("tokens_per_s_run", "launch_to_first_step_s")}
            log(f"{example} {mode}: {json.dumps(shown)}")
        result["examples"][example] = {"runs": runs, "sandboxed_vs_baseline": compare(runs)}
        log(f"{example}: sandboxed / baseline {json.dumps(result['examples'][example]['sandboxed_vs_baseline'])}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if os.environ.get("OUT"):
        (pathlib.Path(os.environ["OUT"]) / out.name).write_text(out.read_text())
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
