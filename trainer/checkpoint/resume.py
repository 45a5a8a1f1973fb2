"""Resuming: the checkpoint a run continues from (the newest that verifies across tiers, hashed ahead while the
model compiles; stale and unreachable local ones skipped) and loading it into the model and optimizer."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from core.telemetry import Telemetry
from trainer.checkpoint.raw import load_raw
from trainer.checkpoint.store import EXTRA, MANIFEST, PREFIX, list_checkpoints, verify
from trainer.checkpoint.tiers import DURABLE, LOCAL, Tiers

VERIFY_AHEAD = 3  # checkpoints verify_ahead hashes at most, newest first, until one verifies


def _files_stamp(path: pathlib.Path) -> tuple[Any, ...] | None:
    """What a checkpoint directory holds, as names, sizes, inodes and modification times: a file rewritten,
    replaced or added since a verification changes it."""
    try:
        with os.scandir(path) as it:
            stats = [(e.name, e.stat()) for e in it]
    except OSError:
        return None
    return tuple(sorted((name, st.st_size, st.st_ino, st.st_mtime_ns) for name, st in stats))


class Resuming(Tiers):
    """The ``Checkpointer``'s loading side (its state is set up by ``Checkpointer.__init__``)."""

    rank: int
    world_size: int
    sharded: bool
    group: Any
    tel: Telemetry
    _verifying: threading.Thread | None
    _verified: dict[pathlib.Path, tuple[tuple[Any, ...] | None, str | None]]

    def verify_ahead(self) -> None:
        """Rank 0: hash the newest checkpoints against their manifests in a thread now, while the model compiles
        (a GB takes most of a second; hashing and reading release the GIL); ``choose`` takes each answer for a
        checkpoint whose files are unchanged since, and verifies anything else itself."""
        if self.rank != 0 or self._verifying is not None:
            return

        def run() -> None:
            for _, _, path in self._candidates(local_ok=True)[:VERIFY_AHEAD]:
                why = verify(path)
                self._verified[path] = (_files_stamp(path), why)
                if why is None:
                    return

        self._verifying = threading.Thread(target=run, name="kiln-ckpt-verify", daemon=True)
        self._verifying.start()

    def _verify(self, path: pathlib.Path) -> str | None:
        if self._verifying is not None:
            self._verifying.join()
        stamp, why = self._verified.pop(path, (None, "not verified ahead"))
        return why if stamp is not None and stamp == _files_stamp(path) else verify(path)

    def _candidates(self, *, local_ok: bool) -> list[tuple[int, int, pathlib.Path]]:
        """Every checkpoint of both tiers, newest first (durable first at equal steps)."""
        cands: list[tuple[int, int, pathlib.Path]] = [(s, 1, p) for s, p in list_checkpoints(self.root)]
        if self.local_root is not None and local_ok:
            cands += [(s, 0, p) for s, p in list_checkpoints(self.local_root)]
        return sorted(cands, key=lambda c: (c[0], c[1]), reverse=True)

    def _pick(self, before_step: int | None, local_ok: bool) -> str | None:
        """Rank 0: the newest checkpoint that verifies, across tiers (durable first at equal steps).  A local
        one older in lineage than the durable tier (written under a lower fencing token than the newest
        durable checkpoint: an earlier attempt on this host, since overtaken elsewhere) is skipped."""
        cands = self._candidates(local_ok=local_ok)
        durable_token = -1
        for _, _, p in cands:
            if p.parent == self.root:
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    tok = json.loads((p / MANIFEST).read_text()).get("fencing_token")
                    durable_token = max(durable_token, tok if tok is not None else -1)
        for step, _, path in cands:
            if before_step is not None and step >= before_step:
                continue
            tier = self.tier_of(path)
            why = self._verify(path)
            if why is None and tier == LOCAL:
                tok = json.loads((path / MANIFEST).read_text()).get("fencing_token")
                if (tok if tok is not None else -1) < durable_token:
                    self.tel.event(
                        "CHECKPOINT_STALE_LOCAL",
                        f"skipping local checkpoint {path.name}: written "
                        f"under token {tok}, the durable tier has token {durable_token}",
                        step=step,
                        path=str(path),
                        token=tok,
                        durable_token=durable_token,
                        tier=tier,
                    )
                    continue
            if why is None:
                return str(path)
            self.tel.event(
                "CHECKPOINT_CORRUPT",
                f"skipping {tier} checkpoint {path.name}: {why}",
                step=step,
                path=str(path),
                reason=why,
                tier=tier,
            )
        return None

    def choose(self, *, before_step: int | None = None) -> pathlib.Path | None:
        """Rank 0 picks the newest checkpoint that verifies in either tier (skipping corrupt ones, with an
        event) and tells the others, so every rank loads the same one.  A local-tier pick is used only if
        every rank can read it (ranks on another host cannot): otherwise the durable tier decides."""
        local_ok = True
        while True:
            chosen: list[Any] = [None]
            if self.rank == 0:
                chosen[0] = self._pick(before_step, local_ok)
            if self.world_size > 1:
                dist.broadcast_object_list(chosen, src=0, group=self.group)
            path = pathlib.Path(chosen[0]) if chosen[0] else None
            if path is None or self.world_size == 1 or not local_ok or self.tier_of(path) == DURABLE:
                return path
            seen = torch.tensor([int((path / MANIFEST).is_file())], dtype=torch.int32)
            dist.all_reduce(seen, op=dist.ReduceOp.MIN, group=self.group)
            if bool(seen[0]):
                return path
            if self.rank == 0:
                self.tel.event(
                    "CHECKPOINT_LOCAL_UNREACHABLE",
                    f"{path} is not visible to every rank: resuming from the durable tier",
                    step=int(path.name[len(PREFIX) :]),
                    path=str(path),
                    tier=LOCAL,
                )
            local_ok = False

    def load(self, path: pathlib.Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Restore model and optimizer from ``path``; returns this rank's extra state."""
        manifest = json.loads((path / MANIFEST).read_text())
        if manifest["format"] == "dcp":
            if not self.sharded:
                raise RuntimeError("a sharded (DCP) checkpoint cannot be loaded into a replicated run")
            import torch.distributed.checkpoint as dcp

            msd_d = get_model_state_dict(model)
            osd_d = get_optimizer_state_dict(model, optimizer)
            state: dict[str, Any] = {"model": msd_d, "optim": osd_d}
            dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), process_group=self.group)
            set_model_state_dict(model, msd_d)  # dcp.load filled these dicts in place
            set_optimizer_state_dict(model, optimizer, osd_d)
        else:
            if self.sharded:
                opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
            else:
                opts = StateDictOptions()
            msd: dict[str, Any]
            osd: dict[str, Any]
            if manifest["format"] == "raw":
                full = load_raw(path)
                msd, osd = full["model"], full["optim"]
            else:  # "torch": written by an attempt before the raw format
                msd = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
                osd = torch.load(path / "optim.pt", map_location="cpu", weights_only=True)
            set_model_state_dict(model, msd, options=opts)
            set_optimizer_state_dict(model, optimizer, osd, options=opts)
        # weights_only: the trainer's state is plain data and tensors; unpickling anything else from a directory a
        # job shares with its earlier attempts would run whatever code a crafted file names.
        extras = torch.load(path / EXTRA, map_location="cpu", weights_only=True)
        # A run resumed on a different world size keeps rank 0's trainer state for the new ranks.
        return extras[self.rank] if self.rank < len(extras) else extras[0]
