"""Does CUDA run in kiln's sandbox as a team's uid, at full speed, with only its GPU's nodes, and as an MPS client?

    python3 bench/sandbox_gpu_probe.py            # a GPU host, as root (what the worker is)
    python3 bench/sandbox_gpu_probe.py --smoke    # CPU: the harness only (the snippet on the CPU)

A direct call of the sandbox the worker builds (``workers.sandbox.Sandbox``), not a job: the bound of what
``bench/sandbox_bench.py`` measures through ``kiln up``. Runs one snippet (a bf16 8192^3 matrix product, timed with
CUDA events, and what the process sees of the devices) outside any sandbox, inside one as an unprivileged uid with
the GPU's nodes bound, and inside one as a client of an MPS daemon started by ``workers.mps`` (50% of the SMs), its
pipe directory bound. JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.attempt_user import RANGE_START, AttemptUser  # noqa: E402
from workers.sandbox import NVIDIA_CONTROL_DEVICES, Sandbox, View  # noqa: E402

SNIPPET = """
import glob, json, os, torch
out = {"uid": os.getuid(), "dev_nvidia": sorted(glob.glob("/dev/nvidia*")), "cuda": torch.cuda.is_available()}
if not out["cuda"]:
    try:
        torch.cuda.init()
    except Exception as exc:
        out["cuda_error"] = repr(exc)[:300]
dev = "cuda" if out["cuda"] else "cpu"
n = 8192 if dev == "cuda" else 512
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
b = torch.randn(n, n, device=dev, dtype=a.dtype)
for _ in range(3):
    c = a @ b
if dev == "cuda":
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        c = a @ b
    e.record()
    torch.cuda.synchronize()
    out["tflops"] = 20 * 2 * n**3 / (s.elapsed_time(e) / 1e3) / 1e12
    out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
out["finite"] = bool(torch.isfinite(c).all())
print(json.dumps(out))
"""


def gpu_nodes() -> tuple[pathlib.Path, ...]:
    try:
        import pynvml

        pynvml.nvmlInit()
        minors = [pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(0))]
    except Exception:
        return ()
    control = [pathlib.Path("/dev") / d for d in NVIDIA_CONTROL_DEVICES if (pathlib.Path("/dev") / d).exists()]
    return (*(pathlib.Path(f"/dev/nvidia{m}") for m in minors), *control)


def run(argv: list[str], env: dict[str, str], fds: list[int] | None = None) -> dict[str, Any]:
    t0 = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, pass_fds=fds or ())
    out: dict[str, Any] = {"returncode": done.returncode, "wall_s": round(time.time() - t0, 3)}
    try:
        out |= json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        out["stdout"], out["stderr"] = done.stdout[-2000:], done.stderr[-2000:]
    return out


def mps_variants(
    argv: list[str], env: dict[str, str], sandbox: Sandbox, py: list[str], view: View, user: AttemptUser | None
) -> dict[str, Any]:
    """What an MPS client in the sandbox needs of the host: its /dev/shm, its IPC namespace, its PID namespace."""
    out: dict[str, Any] = {}
    changes = {
        "host_shm": lambda a: _replace(
            a, ["--perms", "1777", "--tmpfs", "/dev/shm"], ["--bind", "/dev/shm", "/dev/shm"]
        ),
        "host_ipc": lambda a: [x for x in a if x != "--unshare-ipc"],
        "host_pid": lambda a: [x for x in a if x != "--unshare-pid"],
    }
    combos = [
        ("host_shm",),
        ("host_shm", "host_ipc"),
        ("host_shm", "host_pid"),
        ("host_ipc", "host_pid"),
        ("host_shm", "host_ipc", "host_pid"),
    ]
    for combo in combos:
        launch = sandbox.command(py, view, user=user)
        args = launch.argv
        for name in combo:
            args = changes[name](args)
        got = run(args, env, launch.fds)
        launch.close()
        out["+".join(combo)] = {k: got.get(k) for k in ("returncode", "cuda", "cuda_error", "tflops", "stderr")}
    return out


def _replace(argv: list[str], old: list[str], new: list[str]) -> list[str]:
    for i in range(len(argv) - len(old) + 1):
        if argv[i : i + len(old)] == old:
            return argv[:i] + new + argv[i + len(old) :]
    return argv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "sandbox_gpu_probe.json")
    args = ap.parse_args()
    home = pathlib.Path(tempfile.mkdtemp(prefix="kiln-probe-"))
    sandbox = Sandbox.detect([home])
    user = AttemptUser(RANGE_START + 1, RANGE_START + 1) if sandbox.as_root else None
    work = home / "run"
    work.mkdir()
    if user is not None:
        os.chown(work, user.uid, user.gid)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "PYTHONUNBUFFERED": "1"}
    py = [sys.executable, "-c", SNIPPET]
    result: dict[str, Any] = {
        "bwrap": sandbox.bwrap,
        "as_root": sandbox.as_root,
        "runtime": [str(p) for p in sandbox.runtime],
    }
    result["outside"] = run(py, env)
    nodes = () if args.smoke else gpu_nodes()
    launch = sandbox.command(py, View(writable=(work,), devices=nodes, cwd=work), user=user)
    result["sandboxed"] = run(launch.argv, env, launch.fds)
    launch.close()
    if not args.smoke:
        from workers.mps import MpsDaemon

        daemon = MpsDaemon.find("auto", "nvidia-cuda-mps-control", home / "mps" / "probe")
        if daemon is not None:
            daemon.for_team_users = True
            result["mps_started"] = daemon.start()
            share = env | daemon.client_env() | {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
            view = View(writable=(work,), devices=nodes, shared=(daemon.pipe_dir, daemon.log_dir), cwd=work)
            launch = sandbox.command(py, view, user=user)
            result["sandboxed_mps_50pct"] = run(launch.argv, share, launch.fds)
            launch.close()
            result["outside_mps_50pct"] = run(py, share)
            result["mps_variants"] = mps_variants(launch.argv, share, sandbox, py, view, user)
            daemon.stop()
    base, box = result["outside"].get("tflops"), result["sandboxed"].get("tflops")
    result["sandboxed_vs_outside_tflops"] = round(box / base, 4) if base and box else None
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if os.environ.get("OUT"):
        (pathlib.Path(os.environ["OUT"]) / args.out.name).write_text(args.out.read_text())


if __name__ == "__main__":
    main()
