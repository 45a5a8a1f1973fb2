"""A hostile team's code (recipe protocol 1): ``build_model`` first attacks the host, another team or kiln, then
trains a tiny model. ``attack: all`` runs every attack of ``attacks.py`` against the paths and pids in ``target``
(JSON); ``memory`` hoards the host's memory. A defence that works makes the attempt fail with the OS's refusal
(PermissionError, the user's own error) or contains it; an attack that works raises ATTACK SUCCEEDED."""

import json

import attacks
import torch
from pydantic import BaseModel

KILN_PROTOCOL = 1


class Hyperparameters(BaseModel):
    attack: str
    target: str = ""


def build_model(hp: Hyperparameters) -> torch.nn.Module:
    if hp.attack == "all":
        attacks.run_all(json.loads(hp.target))
    elif hp.attack == "memory":  # the host's memory
        hoard = [b"x" * (256 << 20) for _ in range(64)]
        raise RuntimeError(f"ATTACK SUCCEEDED: held {len(hoard) * 256} MiB")
    elif hp.attack == "daemon":  # leave a process behind, then train to the end
        attacks.leave_a_process({})
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
