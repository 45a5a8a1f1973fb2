"""What a hostile member's code tries from inside its attempt, knowing every path and pid it could want.

``run_all(targets)`` tries each attack, prints one line for each (``DENIED name: why`` or ``SUCCEEDED name: what``)
and raises: ``RuntimeError("ATTACK SUCCEEDED: ...")`` if any attack worked, else ``PermissionError`` naming how many
were denied, which becomes the job's reason. ``targets`` (JSON): kiln's files (database, broker, token file, venv),
another team's checkpoints, code, dataset and log, this team's own dataset, the worker's pid, the API's port.
Only the standard library: the same file serves the recipe (``hostile.py``) and the script (``train.py``).
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ATTACKS: dict[str, Callable[[dict[str, Any]], str]] = {}


class Succeeded(Exception):
    pass


def attack(fn: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], str]:
    ATTACKS[fn.__name__.replace("_", "-")] = fn
    return fn


def _read(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(64)
    raise Succeeded(f"read {len(data)} bytes of {path}")


def _each(action: Callable[[str], object], paths: list[str]) -> str:
    """``action`` on every path (it raises Succeeded when one works); the OS's refusals, one per path."""
    errors = []
    for path in paths:
        try:
            action(path)
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror}")
    return "; ".join(errors)


def _read_any(paths: list[str]) -> str:
    return _each(_read, paths)


def _listing(path: str) -> list[str]:
    found = []
    for root, _dirs, files in os.walk(path):
        found += [os.path.join(root, f) for f in files]
    return found


@attack
def read_database(t: dict[str, Any]) -> str:
    return _read_any([t["database"], t["broker"]])


@attack
def read_tokens(t: dict[str, Any]) -> str:
    return _read_any([t["token_file"], "/root/.config/kiln/config.json"])


@attack
def root_home(t: dict[str, Any]) -> str:
    seen = sorted(os.listdir("/root")) if os.path.isdir("/root") else []
    extra = [name for name in seen if name not in t["runtime_in_root"]]
    if extra:
        raise Succeeded(f"/root shows {extra}")
    return _read_any(["/root/.bash_history", "/root/.profile"]) + f"; /root shows only {seen}"


@attack
def worker_environment(t: dict[str, Any]) -> str:
    leaked = [k for k in os.environ if k.startswith("KILN_") and ("URL" in k or "PASSWORD" in k)]
    if leaked:
        raise Succeeded(f"inherited {leaked}")
    for pid in [t["worker_pid"], *(p for p in os.listdir("/proc") if p.isdigit())]:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"KILN_DATABASE" in environ or b"KILN_BROKER" in environ or b"KILN_HOME" in environ:
            raise Succeeded(f"read kiln's settings in /proc/{pid}/environ")
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return f"no KILN_* setting in the environment; /proc shows pids {pids}"


@attack
def other_team_checkpoints(t: dict[str, Any]) -> str:
    files = _listing(t["victim_checkpoints"])
    if files:
        return _read_any(files)
    return _read_any([t["victim_checkpoints"] + "/fence"]) + f"; {t['victim_checkpoints']} lists nothing"


@attack
def other_team_code(t: dict[str, Any]) -> str:
    files = _listing(t["victim_artifacts"]) + _listing(t["victim_run_code"])
    return _read_any(files) if files else _read_any([t["victim_artifacts"], t["victim_run_code"]])


@attack
def other_team_dataset(t: dict[str, Any]) -> str:
    return _read_any([t["victim_dataset_file"]])


@attack
def other_team_log(t: dict[str, Any]) -> str:
    return _read_any([t["victim_log"]])


def _write(path: str) -> None:
    with open(path, "w") as f:
        f.write("import os; os.system('id > /tmp/pwned')\n")
    raise Succeeded(f"wrote {path}")


def _write_any(paths: list[str]) -> str:
    return _each(_write, paths)


@attack
def write_kiln_runtime(t: dict[str, Any]) -> str:
    pth = os.path.join(t["site_packages"], "zz_hostile.pth")
    return _write_any([pth, os.path.join(t["kiln_root"], "core", "x.py")])


@attack
def write_other_team(t: dict[str, Any]) -> str:
    return _write_any([os.path.join(t["victim_checkpoints"], "planted.txt"), os.path.join(t["storage"], "planted.txt")])


@attack
def write_own_dataset(t: dict[str, Any]) -> str:
    return _write_any([os.path.join(t["own_dataset_dir"], "planted.txt")])


@attack
def signal_kiln(t: dict[str, Any]) -> str:
    errors = []
    for pid in t["kiln_pids"]:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError as exc:
            errors.append(f"{pid}: {exc.strerror}")
            continue
        raise Succeeded(f"sent SIGTERM to kiln's process {pid}")
    return "; ".join(errors)


@attack
def ptrace_kiln(t: dict[str, Any]) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    errors = []
    for pid in t["kiln_pids"]:
        if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
            raise Succeeded(f"attached to kiln's process {pid}")
        errors.append(f"{pid}: {os.strerror(ctypes.get_errno())}")
    return "; ".join(errors)


@attack
def network(t: dict[str, Any]) -> str:
    errors = []
    for host, port in [("127.0.0.1", t["api_port"]), ("127.0.0.1", 5432), ("127.0.0.1", 6379), *t["host_addresses"]]:
        try:
            socket.create_connection((host, port), timeout=2).close()
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
            continue
        raise Succeeded(f"connected to {host}:{port}")
    return "; ".join(errors)


@attack
def gpus(t: dict[str, Any]) -> str:
    nodes = glob.glob("/dev/nvidia*")
    if len([n for n in nodes if n[len("/dev/nvidia") :].isdigit()]) > t["gpus"]:
        raise Succeeded(f"sees device nodes {nodes}")
    return f"device nodes {nodes}"


@attack
def setuid_root(t: dict[str, Any]) -> str:
    try:
        os.setuid(0)
    except OSError as exc:
        return exc.strerror or str(exc)
    raise Succeeded("setuid(0)")


@attack
def leave_a_process(t: dict[str, Any]) -> str:
    """A daemon of its own session, deaf to SIGTERM: whether it outlived the attempt the test checks outside."""
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            time.sleep(3600)
        os._exit(0)
    return "left a daemon (the test checks it is gone with the attempt)"


def run_all(targets: dict[str, Any]) -> None:
    denied, succeeded = [], []
    for name, fn in ATTACKS.items():
        try:
            why = fn(targets)
        except Succeeded as exc:
            succeeded.append(f"{name}: {exc}")
            print(f"SUCCEEDED {name}: {exc}", flush=True)
            continue
        except OSError as exc:
            why = f"{errno.errorcode.get(exc.errno or 0, '')} {exc}"
        denied.append(name)
        print(f"DENIED {name}: {why}", flush=True)
    if succeeded:
        raise RuntimeError(f"ATTACK SUCCEEDED: {'; '.join(succeeded)}")
    raise PermissionError(f"kiln denied all {len(denied)} attacks")


if __name__ == "__main__":
    import json

    run_all(json.loads(sys.argv[1]))
