"""A team's code that reads its dataset and then tries to change it (recipe protocol 1): ``build_model`` reads the
dataset's file, then attempts ``attack`` on the read-only mount. A defence that works makes the attempt fail with
the kernel's refusal (the user's own error); an attack that works raises ATTACK SUCCEEDED."""

import ctypes
import os

import torch
from pydantic import BaseModel

KILN_PROTOCOL = 1


class Hyperparameters(BaseModel):
    attack: str


def build_model(hp, *, datasets):
    data = datasets["shared-data"]
    assert (data / "data.bin").read_bytes() == b"payload", "could not read the dataset"
    if hp.attack == "write":  # change a file of the dataset
        (data / "data.bin").write_bytes(b"changed")
        raise RuntimeError("ATTACK SUCCEEDED: wrote into the dataset")
    if hp.attack == "umount":  # take the read-only mount away (to reach what lies under it, or remount it)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(os.fsencode(data), 2) == 0:
            raise RuntimeError("ATTACK SUCCEEDED: unmounted the dataset")
        code = ctypes.get_errno()
        raise PermissionError(code, os.strerror(code), str(data))
    if hp.attack == "remount":  # make it writable again
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(None, os.fsencode(data), None, 32 | 4096, None) == 0:  # MS_REMOUNT | MS_BIND, no MS_RDONLY
            raise RuntimeError("ATTACK SUCCEEDED: remounted the dataset writable")
        code = ctypes.get_errno()
        raise PermissionError(code, os.strerror(code), str(data))
    return torch.nn.Linear(4, 2)


def batches(hp, *, rank, world_size, seed, start):
    i = start
    while True:
        g = torch.Generator().manual_seed(seed * 1000 + i)
        yield torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
        i += 1


def loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)
