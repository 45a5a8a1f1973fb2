"""The team compile cache as a user meets it (issue 40): jobs submitted to kiln and run by its workers.

    python3 bench/compile_cache_bench.py            # on the GPU host (offline: PIP_NO_INDEX=1 PIP_FIND_LINKS=wheels)
    python3 bench/compile_cache_bench.py --smoke    # CPU: a tiny model, to check the harness (CI runs it)

1. ``cold``: ``./kiln up --detach`` on a new KILN_HOME (the embedded default); job A, the shipped GPT example's
   model for ``--steps`` steps, compiles cold on host 1 (kiln up's worker) and publishes the team's entry;
2. ``kill`` (GPU only): job K, the same model at another learning rate, SIGKILLed with its worker's whole process
   group at ``--kill-at``; ``kiln up`` restarts the worker; each part of kill -> first resumed step is timed as
   ``bench/gpu_path_bench.py`` times it;
3. ``second_host``: ``kiln down``, then ``kiln up --no-worker`` on the same home (the same database and storage)
   and a worker of another name (``host2``, its own process and job directories; only the storage shared): job B,
   the same model at another learning rate, must start from the team's entry: its compile time and its process
   start -> first step against A's;
4. ``sweep``: a 12-job sweep on host 2 of a shape no job compiled before (another sequence length), varying only
   the learning rate, one job at a time: how many hit, the compile time each saved, the sweep's GPU time;
5. ``capped`` (GPU only): kiln down, kiln up with ``KILN_ISOLATION=none`` (GPU shares are off while jobs run
   sandboxed: docs/security.md) and a job on a 30% SM share in bf16: its precision event and tokens/s; beside it,
   the same spec by ``python -m trainer`` as a client of the worker's MPS daemon at 30%, once as shipped (Triton
   GEMMs) and once with the Triton check refused (``--no-triton``: the fp32 fallback the trainer takes without it).
Only the standard library here: the CLI does the rest. JSON to ``--out`` (and to $OUT when set).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gpu_path_bench import ROOT, Kiln, log, recovery, run_summary  # noqa: E402  (one driver of ./kiln)

PYTHON = str(ROOT / ".venv" / "bin" / "python")
PHASES = ("cold", "kill", "second_host", "sweep", "capped")


def spec_text(
    name: str,
    *,
    steps: int,
    lr: float,
    smoke: bool,
    seq_len: int = 1024,
    share: str = "",
    sweep: str = "",
    mode: str | None = None,
) -> str:
    """GPT-2 124M at batch 32 x seq_len in bf16 (the shipped example's model); a 1-layer CPU model for the smoke."""
    if smoke:
        hp = f"size: tiny, n_layer: 1, corpus: stdlib, batch_size: 8, seq_len: {seq_len // 8}, lr: {lr}"
        resources, precision, compile_ = "{gpus: 0, cpu_slots: 1}", "fp32", "{mode: " + (mode or "regional") + "}"
    else:
        hp = f"size: gpt2, corpus: stdlib, batch_size: 32, seq_len: {seq_len}, lr: {lr}"
        resources = "{gpus: 1" + (f", gpu_share: {share}" if share else "") + "}"
        precision, compile_ = "bf16", "{mode: " + (mode or "whole") + "}"
    return f"""name: {name}
team: default
recipe: {{name: gpt, hyperparameters: {{{hp}}}}}
steps: {steps}
resources: {resources}
compile: {compile_}
precision: {precision}
checkpointing: {{every_steps: 100, keep_last: 2}}
sla: {{qos: silver}}
{sweep}"""


class Bench:
    def __init__(self, args: argparse.Namespace, work: pathlib.Path) -> None:
        self.args, self.work = args, work
        self.kiln = Kiln(work / "home", args.port)
        self.host2: subprocess.Popen[bytes] | None = None

    def write(self, name: str, text: str) -> pathlib.Path:
        path = self.work / f"{name}.yaml"
        path.write_text(text)
        return path

    def finished(self, job_id: int, timeout: float = 1200) -> dict[str, Any]:
        return self.kiln.wait(job_id, lambda j: j["state"] == "SUCCEEDED", timeout, "SUCCEEDED")

    def start_profile(self, job_id: int, attempt: int | None = None) -> dict[str, Any]:
        """Process start -> first step of an attempt (default: the last, the one that trained), and its compile,
        from the trainer's own telemetry."""
        attempts = self.kiln.attempts(job_id)
        attempt = attempt if attempt is not None else attempts[-1]["number"]
        recs = self.kiln.telemetry(job_id, attempt)
        started = next(r for r in recs if r["kind"] == "diagnostic" and r["type"] == "STARTED")
        setup = next((r for r in recs if r["kind"] == "diagnostic" and r["type"] == "SETUP_TIMES"), None)
        first_step = next(r for r in recs if r["kind"] == "step")
        summary = run_summary(recs, warmup=min(20, self.args.steps // 4))
        compile_ = summary["compile"] or {}
        return {
            "job_id": job_id,
            "attempt": attempt,
            "attempts": [{k: a[k] for k in ("number", "state", "exit_reason")} for a in attempts],
            "process_start_to_first_step_s": round(first_step["ts"] - started["fields"]["process_start_ts"], 3),
            "compile_s": compile_.get("elapsed_s"),
            "cache_hit": compile_.get("cache_hit"),
            "cache_source": compile_.get("cache_source"),
            "cache_key": compile_.get("cache_key"),
            "saved_s": compile_.get("saved_s"),
            "load_s": compile_.get("load_s"),
            "setup_s": setup["fields"] if setup else None,
            "tokens_per_s_steady": summary["tokens_per_s_steady"],
            "final_loss": summary["final_loss"],
            "precision_events": [
                {"type": r["type"], "message": r["message"]}
                for r in recs
                if r["kind"] == "event" and r["type"].startswith("PRECISION")
            ],
            # What the compile did, hit or not: a fallback's reason and error, a rejected entry's check.
            "compile_events": [
                {"type": r["type"], "message": r["message"], **_compile_detail(r.get("fields") or {})}
                for r in recs
                if r["kind"] == "event" and r["type"].startswith(("COMPILE", "FALLBACK"))
            ],
        }

    def gpu_seconds(self, job_id: int) -> float:
        """The job's attempts' wall time on its GPU (RUNNING -> end), as usage counts it."""
        total = 0.0
        for a in self.kiln.attempts(job_id):
            if a.get("started_at") and a.get("ended_at"):
                total += _ts(a["ended_at"]) - _ts(a["started_at"])
        return round(total, 3)

    def up(self, *extra: str, env: dict[str, str] | None = None) -> None:
        saved = dict(self.kiln.env)
        self.kiln.env.update(env or {})
        proc = self.kiln.cli("up", "--detach", "--port", str(self.kiln.port), *extra, timeout=900)
        self.kiln.env = saved
        if proc.returncode != 0:
            raise RuntimeError(f"kiln up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        self.kiln.token = json.loads((self.kiln.home / "config" / "kiln" / "config.json").read_text())["token"]

    def down(self) -> None:
        if self.host2 is not None:
            self.host2.send_signal(signal.SIGTERM)
            self.host2.wait(timeout=120)
            self.host2 = None
        self.kiln.cli("down", timeout=300)

    # ---- phases ---------------------------------------------------------------------------------------------
    def cold(self) -> dict[str, Any]:
        self.up()
        job = self.kiln.submit(
            self.write(
                "a", spec_text("a", steps=self.args.steps, lr=6e-4, smoke=self.args.smoke, mode=self.args.compile_mode)
            )
        )
        self.finished(job)
        out = self.start_profile(job)
        log(
            f"job A (cold, host 1): compile {out['compile_s']:.1f} s, start -> first step "
            f"{out['process_start_to_first_step_s']:.1f} s"
        )
        return out

    def kill(self) -> dict[str, Any]:
        spec = self.write(
            "k", spec_text("k", steps=self.args.kill_steps, lr=3e-4, smoke=self.args.smoke, mode=self.args.compile_mode)
        )
        job = self.kiln.submit(spec)
        self.kiln.wait(job, lambda j: (j.get("last_step") or 0) >= self.args.kill_at, 900, f"step {self.args.kill_at}")
        pid = self.kiln.worker_pid()
        kill_t = time.time()
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        log(f"killed the worker's process group (pid {pid}) at {time.strftime('%H:%M:%S')}")
        self.finished(job)
        out = recovery(self.kiln, job, kill_t)
        out["first_attempt"] = self.start_profile(job, 1)
        log(f"kill -> first resumed step {out['kill_to_first_resumed_step_s']} s: {out['parts_s']}")
        return out

    def second_host(self) -> dict[str, Any]:
        self.down()
        self.up("--no-worker")
        env = {**self.kiln.env, "KILN_LOCAL_TIER_DIR": str(self.work / "host2-local")}
        cmd = [PYTHON, "-m", "workers", "--host", "host2", "--cpu-slots", "2"]
        with open(self.work / "host2.log", "wb") as out:  # the child keeps its own copy of the descriptor
            self.host2 = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        job = self.kiln.submit(
            self.write(
                "b", spec_text("b", steps=self.args.steps, lr=1e-3, smoke=self.args.smoke, mode=self.args.compile_mode)
            )
        )
        self.finished(job)
        out = self.start_profile(job)
        out["placement"] = self.kiln.attempts(job)[-1]["placement"]
        log(
            f"job B (host 2): {out['cache_source']} hit={out['cache_hit']}, compile {out['compile_s']:.2f} s, start "
            f"-> first step {out['process_start_to_first_step_s']:.1f} s"
        )
        return out

    def sweep(self) -> dict[str, Any]:
        n = self.args.sweep_jobs
        section = (
            f"sweep:\n  random:\n    lr: {{log_uniform: [0.0001, 0.003]}}\n  count: {n}\n  seed: 1\n"
            "  max_concurrent: 1\n"
        )
        text = spec_text(
            "sweep",
            steps=self.args.sweep_steps,
            lr=1e-3,
            smoke=self.args.smoke,
            mode=self.args.compile_mode,
            seq_len=512,
            sweep=section,
        )
        proc = self.kiln.cli("sweep", "submit", str(self.write("sweep", text)), "--output", "json")
        if proc.returncode != 0:
            raise RuntimeError(f"sweep submit failed: {proc.stdout}{proc.stderr}")
        sweep_id = int(json.loads(proc.stdout)["id"])
        t0 = time.time()
        deadline = t0 + 3600
        while time.time() < deadline:
            jobs = self.kiln.get(f"/v1/sweeps/{sweep_id}")["jobs"]
            if len(jobs) == n and all(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for j in jobs):
                break
            time.sleep(2)
        ids = sorted(j["id"] for j in jobs)
        per_job = [self.start_profile(i) for i in ids]
        hits = sum(1 for p in per_job if p["cache_hit"])
        saved = sum(p["saved_s"] or 0.0 for p in per_job)
        gpu_s = sum(self.gpu_seconds(i) for i in ids)
        out = {
            "sweep_id": sweep_id,
            "jobs": per_job,
            "hits": hits,
            "of": n,
            "reuse": hits / n,
            "states": {j["id"]: j["state"] for j in jobs},
            "compile_saved_s": round(saved, 3),
            "gpu_s": round(gpu_s, 3),
            # Had every job compiled cold, each would have paid its entry's cold compile instead of its warm one.
            "gpu_s_if_all_cold": round(gpu_s + saved, 3),
            "wall_s": round(time.time() - t0, 1),
        }
        log(f"sweep: {hits}/{n} hits, {saved:.1f} s of compile saved of {gpu_s:.1f} GPU-seconds")
        return out

    def capped(self) -> dict[str, Any]:
        self.down()  # (nothing to stop when this phase runs alone)
        self.up(env={"KILN_ISOLATION": "none"})
        share = "{sm_percent: 30}"
        steps = self.args.capped_steps
        job = self.kiln.submit(
            self.write("capped", spec_text("capped", steps=steps, lr=6e-4, smoke=False, share=share))
        )
        self.finished(job)
        through_kiln = self.start_profile(job)
        pipe = sorted((self.kiln.home / "storage" / "mps").glob("*/pipe"))[0]
        mps = {
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(pipe.parent / "log"),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        }
        spec = self.write("direct", spec_text("direct", steps=steps, lr=6e-4, smoke=False))
        direct = {
            name: self.direct(spec, mps, name, refuse_triton=name == "fp32_fallback")
            for name in ("triton_bf16", "fp32_fallback")
        }
        base = direct["fp32_fallback"]["tokens_per_s_steady"] or 1.0
        return {
            "through_kiln": through_kiln,
            "direct": direct,
            "kiln_triton_bf16_over_fp32_fallback": (through_kiln["tokens_per_s_steady"] or 0) / base,
            "direct_triton_bf16_over_fp32_fallback": (direct["triton_bf16"]["tokens_per_s_steady"] or 0) / base,
        }

    def direct(self, spec: pathlib.Path, mps: dict[str, str], name: str, *, refuse_triton: bool) -> dict[str, Any]:
        """``python -m trainer`` as an MPS client (the bound): with ``refuse_triton`` the Triton check reports
        failure, so the trainer takes the fp32 fallback it took before Triton GEMMs (nothing else changes)."""
        run = self.work / f"direct-{name}"
        # The team's tier in kiln's storage: the kiln job's autotuned Triton GEMMs (same key) serve the direct run.
        (team,) = (self.kiln.home / "storage" / "compile_cache" / "teams").iterdir()
        env = {
            **self.kiln.env,
            **mps,
            "KILN_COMPILE_CACHE_DIR": str(self.work / f"direct-cache-{name}"),
            "KILN_TEAM_COMPILE_CACHE_DIR": str(team),
        }
        prelude = (
            "import sys, trainer.gemm_check as g; g.check_triton_gemms = lambda *a, **k: g.GemmCheck(False, "
            "'refused by the bench'); "
            if refuse_triton
            else "import sys; "
        )
        code = prelude + "from trainer.__main__ import main; sys.exit(main(sys.argv[1:]))"
        cmd = [PYTHON, "-c", code, "--spec", str(spec), "--run-dir", str(run)]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"direct trainer {name} failed:\n{done.stderr[-3000:]}")
        recs = [json.loads(line) for line in (run / "telemetry" / "rank0.jsonl").read_text().splitlines() if line]
        summary = run_summary(recs, warmup=20)
        events = [
            {"type": r["type"], "message": r["message"]}
            for r in recs
            if r["kind"] == "event" and r["type"].startswith("PRECISION")
        ]
        log(f"direct {name}: {summary['tokens_per_s_steady']} tokens/s; {events}")
        return {
            "tokens_per_s_steady": summary["tokens_per_s_steady"],
            "final_loss": summary["final_loss"],
            "precision_events": events,
            "compile": summary["compile"],
        }


def _compile_detail(fields: dict[str, Any]) -> dict[str, Any]:
    keep = ("cache_hit", "cache_source", "elapsed_s", "eager_loss", "compiled_loss", "error", "reason", "check")
    return {k: fields[k] for k in keep if k in fields}


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's acceptance, as figures: B's compile <= 15% of A's and start <= 30%; >= 11/12 hits; kill <= 12 s."""
    out: dict[str, Any] = {}
    if "cold" in result and "second_host" in result:
        a, b = result["cold"], result["second_host"]
        out["b_compile_over_a"] = b["compile_s"] / a["compile_s"]
        out["b_start_over_a"] = b["process_start_to_first_step_s"] / a["process_start_to_first_step_s"]
        out["b_hit_from_team"] = b["cache_source"] == "team"
    if "sweep" in result:
        out["sweep_hits"] = f"{result['sweep']['hits']}/{result['sweep']['of']}"
    if "kill" in result:
        out["kill_to_first_resumed_step_s"] = result["kill"]["kill_to_first_resumed_step_s"]
    if "capped" in result:
        out["capped_kiln_triton_bf16_over_fp32_fallback"] = result["capped"]["kiln_triton_bf16_over_fp32_fallback"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU: a 1-layer model, three sweep jobs, no kill or share")
    p.add_argument("--steps", type=int, default=None, help="steps of jobs A and B (default 200; smoke 8)")
    p.add_argument("--kill-steps", type=int, default=1500)
    p.add_argument("--kill-at", type=int, default=500)
    p.add_argument("--sweep-jobs", type=int, default=None, help="default 12 (smoke 3)")
    p.add_argument("--sweep-steps", type=int, default=None, help="default 100 (smoke 4)")
    p.add_argument("--capped-steps", type=int, default=300)
    p.add_argument(
        "--phases",
        default=None,
        help="a comma list of " + ",".join(PHASES) + " (default: all; smoke: no kill, no capped)",
    )
    p.add_argument("--compile-mode", default=None, help="the specs' compile mode (default: whole; smoke: regional)")
    p.add_argument("--port", type=int, default=None, help="the API's port (default: a free one)")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "compile_cache_bench.json")
    args = p.parse_args()
    args.port = args.port or free_port()
    args.steps = args.steps or (8 if args.smoke else 200)
    args.sweep_jobs = args.sweep_jobs or (3 if args.smoke else 12)
    args.sweep_steps = args.sweep_steps or (4 if args.smoke else 100)
    phases = (args.phases or ("cold,second_host,sweep" if args.smoke else ",".join(PHASES))).split(",")
    if unknown := set(phases) - set(PHASES):
        p.error(f"unknown phases {sorted(unknown)}; the phases are {', '.join(PHASES)}")
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="kiln-cache-bench-") as tmp:
        bench = Bench(args, pathlib.Path(tmp))
        try:
            for phase in PHASES:  # in this order: each later one reads what the earlier ones left
                if phase in phases:
                    result[phase] = getattr(bench, phase)()
                    save(result, args.out)  # a run cut off by its machine's time limit keeps what it finished
            result["verdicts"] = verdicts(result)
        finally:
            with contextlib.suppress(OSError), open(pathlib.Path(tmp) / "home" / "logs" / "up.log") as f:
                result["up_log_tail"] = f.read()[-4000:]
            bench.down()
            save(result, args.out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save(result: dict[str, Any], out: pathlib.Path) -> None:
    text = json.dumps(result, indent=1, default=str)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if os.environ.get("OUT"):
        (pathlib.Path(os.environ["OUT"]) / out.name).write_text(text)
    log(f"wrote {out}: {json.dumps(result.get('verdicts'))}")


if __name__ == "__main__":
    main()
