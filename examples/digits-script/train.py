"""A plain PyTorch training script, run by kiln in script mode (docs/user-code.md, "Script mode").

An MLP on scikit-learn's handwritten digits (8x8 images shipped inside scikit-learn's wheel: nothing is
downloaded), trained with its own loop and optimiser. kiln runs it under torchrun (``RANK``, ``WORLD_SIZE``, ...)
from the uploaded directory; it uses kiln's client only to report its steps, commit its checkpoints under the fence
and resume from the newest verified one after a restart:

    python train.py [--every 50] [--batch-size 64] [--lr 0.003] [--pace 0]

Outside kiln the same file runs as it is (``python train.py``: checkpoints in ./kiln-checkpoints).
Batch ``i`` is a function of (seed, i), so a run resumed at step ``k`` sees the batches an uninterrupted one would.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from trainer import script_client as kiln

HELD_OUT = 0.2


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    cut = int(len(y) * (1 - HELD_OUT))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def batch(x: torch.Tensor, y: torch.Tensor, *, seed: int, index: int, size: int, rank: int, world: int):
    """Batch ``index`` of this rank: a function of (seed, index, rank, world size) only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    picks = torch.randint(0, len(y), (size * world,), generator=g)[rank * size : (rank + 1) * size]
    return x[picks], y[picks]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=50, help="checkpoint every this many steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--pace", type=float, default=0.0, help="seconds to sleep per step (demos and tests)")
    args = parser.parse_args()

    rank, world = kiln.rank(), kiln.world_size()
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(kiln.seed())
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    x, y, x_test, y_test = data()

    start = 0
    ckpt = kiln.latest_checkpoint()  # None on a fresh start
    if ckpt is not None:
        state = torch.load(ckpt.path / "state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = ckpt.step
        print(f"resumed from step {start}", flush=True)

    loss = torch.tensor(float("nan"))
    for step in range(start + 1, kiln.steps() + 1):
        xb, yb = batch(x, y, seed=kiln.seed(), index=step, size=args.batch_size, rank=rank, world=world)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        kiln.report(step, loss.item())
        if args.pace:
            time.sleep(args.pace)
        if step % args.every == 0 or step == kiln.steps():
            if rank == 0:
                with kiln.checkpoint(step, loss=loss.item()) as directory:
                    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, directory / "state.pt")
            if world > 1:
                dist.barrier()

    if rank == 0:
        with torch.no_grad():
            model.eval()
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        kiln.evaluation(kiln.steps(), {"accuracy": accuracy})
        print(f"held-out accuracy {accuracy:.4f} after {kiln.steps()} steps, final loss {loss.item():.4f}", flush=True)
    if world > 1:
        # Leave together, and free the group now: DDP holds it in reference cycles, and left to the interpreter's
        # exit its gloo threads were torn down there and aborted the rank after it finished ("terminate called
        # without an active exception", pytorch#65231: 2 runs of 15 on a loaded box, none of 25 with this).
        dist.barrier()
        dist.destroy_process_group()
        del model, opt
        gc.collect()


if __name__ == "__main__":
    main()
