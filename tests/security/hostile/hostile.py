"""A hostile team's code (recipe protocol 1): ``build_model`` first attempts ``attack`` against the host, another
team or the worker, then trains a tiny model. A defence that works makes the attempt fail with the OS's refusal
(PermissionError, the user's own error) or contains it; an attack that works raises ATTACK SUCCEEDED."""

import os
import signal
import time
from pathlib import Path

import torch
from pydantic import BaseModel

KILN_PROTOCOL = 1


class Hyperparameters(BaseModel):
    attack: str
    target: str = ""


def succeeded(what: str) -> None:
    raise RuntimeError(f"ATTACK SUCCEEDED: {what}")


def attack(hp: Hyperparameters) -> None:
    target = Path(hp.target)
    if hp.attack == "read-checkpoint":  # another team's checkpoint directory
        files = [target / name for name in os.listdir(target) if (target / name).is_file()]
        for p in files:
            p.read_bytes()
        succeeded(f"read {len(files)} files of {target}")
    elif hp.attack == "write-outside":  # into another team's checkpoints (or any kiln directory)
        (target / "planted.txt").write_text("mine now")
        succeeded(f"wrote into {target}")
    elif hp.attack == "worker-environment":  # the worker's settings: database and broker URLs
        leaked = [k for k in os.environ if k.startswith("KILN_") and "URL" in k]
        if leaked:
            succeeded(f"inherited {leaked}")
        Path(f"/proc/{os.getppid()}/environ").read_bytes()
        succeeded("read the worker's /proc environ")
    elif hp.attack == "read-file":  # the worker's database or home
        Path(hp.target).read_bytes()
        succeeded(f"read {hp.target}")
    elif hp.attack == "daemon":  # leave a process behind: double fork, new session, ignore SIGTERM
        marker = Path(os.environ["TMPDIR"]) / "daemon.pid"
        if os.fork() == 0:  # the daemon: its own session, deaf to SIGTERM, outliving the attempt if it can
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            marker.write_text(str(os.getpid()))
            time.sleep(3600)
            os._exit(0)
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    elif hp.attack == "memory":  # the host's memory
        hoard = []
        for _ in range(64):
            hoard.append(b"x" * (256 << 20))
        succeeded(f"held {len(hoard) * 256} MiB")
    elif hp.attack == "setuid":  # regain root through a setuid binary or a capability
        os.setuid(0)
        succeeded("setuid(0)")


def build_model(hp: Hyperparameters) -> torch.nn.Module:
    attack(hp)
    return torch.nn.Linear(4, 2)


def batches(hp, *, rank, world_size, seed, start):
    i = start
    while True:
        g = torch.Generator().manual_seed(seed + i)
        yield torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
        i += 1


def loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)
