"""Asynchronous, atomic, verified checkpoints.

Layout under the job's checkpoint directory (``KILN_CHECKPOINT_DIR``, shared by all its attempts)::

    step_00000040/manifest.json   {"step", "files": {name: {"bytes", "sha256"}}, "fencing_token", ...}
    step_00000040/model.pt, optim.pt, extra.pt            (replicated state: DDP or one process)
    step_00000040/*.distcp, .metadata, extra.pt           (sharded FSDP2 state through DCP)
    fence                                                 (the current fencing token, written by the worker)

Saving: state is staged into reusable CPU buffers (pinned on CUDA, copied on a side stream so the next
step's forward overlaps the copy), then a background thread writes ``.tmp-step_N-*``, fsyncs every file,
writes the manifest with a sha256 per file and renames the directory into place - but only while the fence
file still names this attempt's token.  Loading takes the newest directory whose manifest verifies; corrupt
ones are skipped with an event.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import threading
import time
import uuid
from collections.abc import Callable
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

from core.trainer_protocol import FENCE_FILE, RecordKind
from trainer.telemetry import Telemetry

PREFIX = "step_"
MANIFEST = "manifest.json"
EXTRA = "extra.pt"


class FencedError(RuntimeError):
    """The fence file names another attempt: this one may no longer commit state (-> ExitCode.FENCED)."""


def fence_ok(root: pathlib.Path, token: int | None) -> bool:
    if token is None:
        return True
    try:
        current = (root / FENCE_FILE).read_text().strip()
    except FileNotFoundError:
        return True  # no control plane wrote a fence (standalone run): nothing to respect
    return current == str(token)


def sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def list_checkpoints(root: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    """Committed checkpoint directories, oldest first (temporary directories are never listed)."""
    out = []
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith(PREFIX):
                with contextlib.suppress(ValueError):
                    out.append((int(p.name[len(PREFIX):]), p))
    return sorted(out)


def verify(path: pathlib.Path) -> str | None:
    """None if every file in the manifest is present with its recorded size and sha256, else why not."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest: {exc!r}"
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            return f"missing file {name}"
        if f.stat().st_size != meta["bytes"]:
            return f"size mismatch in {name}"
        if sha256_file(f) != meta["sha256"]:
            return f"sha256 mismatch in {name}"
    return None


def write_manifest_and_commit(tmp: pathlib.Path, final: pathlib.Path, *, step: int, token: int | None,
                              meta: dict[str, Any]) -> dict[str, Any]:
    files = {}
    for f in sorted(tmp.rglob("*")):
        if f.is_file():
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
            files[f.relative_to(tmp).as_posix()] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    manifest = {"step": step, "fencing_token": token, "created": time.time(), "files": files, **meta}
    with open(tmp / MANIFEST, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if not fence_ok(final.parent, token):
        shutil.rmtree(tmp, ignore_errors=True)
        raise FencedError(f"fence no longer names token {token}; checkpoint at step {step} not committed")
    if final.exists():  # a rolled-back run re-reaching a step: the new state replaces the old
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    return manifest


class _Stager:
    """Reusable CPU buffers for a state dict; pinned on CUDA so the device-to-host copy is asynchronous."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.done: torch.cuda.Event | None = None

    def stage(self, state: Any) -> Any:
        seen: dict[tuple[int, tuple[int, ...], torch.dtype], torch.Tensor] = {}
        if self.stream is not None:
            # The copy must see the state as of now: order it after the work already queued.
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with ctx:
            out = self._walk(state, "", seen)
        if self.stream is not None:
            self.done = torch.cuda.Event()
            self.done.record(self.stream)
        return out

    def _walk(self, obj: Any, path: str, seen: dict[tuple[int, tuple[int, ...], torch.dtype], torch.Tensor]) -> Any:
        if isinstance(obj, torch.Tensor):
            key = (obj.data_ptr(), tuple(obj.shape), obj.dtype)
            if obj.numel() and key in seen:  # tied weights: stage (and write) the storage once
                return seen[key]
            buf = self.buffers.get(path)
            if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
                buf = torch.empty(obj.shape, dtype=obj.dtype, device="cpu",
                                  pin_memory=self.device.type == "cuda")
                self.buffers[path] = buf
            buf.copy_(obj.detach(), non_blocking=self.device.type == "cuda")
            if obj.numel():
                seen[key] = buf
            return buf
        if isinstance(obj, dict):
            return {k: self._walk(v, f"{path}/{k}", seen) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._walk(v, f"{path}/{i}", seen) for i, v in enumerate(obj))
        return obj

    def wait_copy(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def order_before_update(self) -> None:
        """Make the compute stream wait for an in-flight copy before the optimizer overwrites the params."""
        if self.done is not None:
            torch.cuda.current_stream(self.device).wait_event(self.done)


class Checkpointer:
    def __init__(self, root: pathlib.Path, *, rank: int, world_size: int, token: int | None, keep_last: int,
                 asynchronous: bool, sharded: bool, group: Any, device: torch.device,
                 telemetry: Telemetry) -> None:
        self.root = root
        self.rank, self.world_size, self.token = rank, world_size, token
        self.keep_last = keep_last
        self.asynchronous = asynchronous
        self.sharded = sharded
        self.group = group  # gloo group reserved for checkpoint collectives (DCP runs them in a thread)
        self.device = device
        self.tel = telemetry
        self.stager = _Stager(device)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.saves = 0
        self.failures = 0
        self.last_save_stall_s = 0.0
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            for p in root.glob(".tmp-*"):  # leftovers of a crashed writer never become checkpoints
                shutil.rmtree(p, ignore_errors=True)

    # ---- saving ---------------------------------------------------------------------------------------
    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, Any],
             *, blocking: bool = False) -> None:
        """Collective: every rank calls it at the same step.  Returns once the state is staged."""
        t0 = time.perf_counter()
        self.wait()  # buffers are reused: the previous write must be finished
        extras = self._gather(extra)
        tmp = self.root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
        meta = {"world_size": self.world_size, "format": "dcp" if self.sharded else "torch",
                "torch": torch.__version__}
        if self.sharded:
            self._save_sharded(step, model, optimizer, extras, tmp, meta)
        else:
            self._save_replicated(step, model, optimizer, extras, tmp, meta)
        self.last_save_stall_s = time.perf_counter() - t0
        if blocking or not self.asynchronous:
            self.wait()

    def _gather(self, extra: dict[str, Any]) -> list[dict[str, Any]]:
        if self.world_size == 1:
            return [extra]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, extra, group=self.group)
        return out

    def _save_replicated(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                         extras: list[dict[str, Any]], tmp: pathlib.Path, meta: dict[str, Any]) -> None:
        if self.rank != 0:
            return  # replicated state: rank 0 holds all of it
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        staged = self.stager.stage(state)

        def write() -> None:
            self.stager.wait_copy()
            tmp.mkdir(parents=True)
            torch.save(staged["model"], tmp / "model.pt")
            torch.save(staged["optim"], tmp / "optim.pt")
            torch.save(extras, tmp / EXTRA)
            self._commit(step, tmp, meta)

        self._start(write)

    def _save_sharded(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                      extras: list[dict[str, Any]], tmp: pathlib.Path, meta: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        opts = StateDictOptions(cpu_offload=True)  # a CPU snapshot of this rank's shards
        state = {"model": get_model_state_dict(model, options=opts),
                 "optim": get_optimizer_state_dict(model, optimizer, options=opts)}
        if self.rank == 0:
            tmp.mkdir(parents=True)
        tmp_name = [tmp.name]
        if self.world_size > 1:
            dist.broadcast_object_list(tmp_name, src=0, group=self.group)
        tmp = self.root / tmp_name[0]

        def write() -> None:
            # DCP's collectives run here, on the checkpoint group, never on the training group.
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp)), process_group=self.group)
            if self.rank == 0:  # DCP's finish gathered every rank's writes: all shards are on disk
                torch.save(extras, tmp / EXTRA)
                self._commit(step, tmp, meta)

        self._start(write)

    def _commit(self, step: int, tmp: pathlib.Path, meta: dict[str, Any]) -> None:
        final = self.root / step_dir_name(step)
        manifest = write_manifest_and_commit(tmp, final, step=step, token=self.token, meta=meta)
        total = sum(f["bytes"] for f in manifest["files"].values())
        self.tel.emit(RecordKind.CHECKPOINT, step=step, path=str(final), bytes=total,
                      sha256=sha256_file(final / MANIFEST), verified=True)
        self.prune()

    def _start(self, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                fn()
                self.saves += 1
            except BaseException as exc:  # surfaced to the training loop by wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name="kiln-ckpt-writer", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the in-flight write (if any) is committed; re-raise what went wrong in it."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            if isinstance(err, FencedError):
                raise err
            self.failures += 1
            self.tel.event("CHECKPOINT_FAILED", f"checkpoint write failed: {err!r}", error=repr(err))

    def before_optimizer_step(self) -> None:
        if self._thread is not None:
            self.stager.order_before_update()

    def prune(self) -> None:
        ckpts = list_checkpoints(self.root)
        for _, path in ckpts[: max(0, len(ckpts) - self.keep_last)]:
            shutil.rmtree(path, ignore_errors=True)

    def delete_from(self, step: int) -> list[int]:
        """Rollback: drop checkpoints at or after ``step`` (they hold the state being rolled back over)."""
        self.wait()
        removed = []
        if self.rank == 0:
            for s, path in list_checkpoints(self.root):
                if s >= step:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(s)
        if self.world_size > 1:
            dist.barrier(group=self.group)
        return removed

    # ---- loading --------------------------------------------------------------------------------------
    def choose(self, *, before_step: int | None = None) -> pathlib.Path | None:
        """Rank 0 picks the newest checkpoint that verifies (skipping corrupt ones, with an event) and
        tells the others, so every rank loads the same one."""
        chosen: list[Any] = [None]
        if self.rank == 0:
            for step, path in reversed(list_checkpoints(self.root)):
                if before_step is not None and step >= before_step:
                    continue
                why = verify(path)
                if why is None:
                    chosen[0] = str(path)
                    break
                self.tel.event("CHECKPOINT_CORRUPT", f"skipping checkpoint {path.name}: {why}",
                               step=step, path=str(path), reason=why)
        if self.world_size > 1:
            dist.broadcast_object_list(chosen, src=0, group=self.group)
        return pathlib.Path(chosen[0]) if chosen[0] else None

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
            msd: dict[str, Any] = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
            osd: dict[str, Any] = torch.load(path / "optim.pt", map_location="cpu", weights_only=True)
            set_model_state_dict(model, msd, options=opts)
            set_optimizer_state_dict(model, optimizer, osd, options=opts)
        extras = torch.load(path / EXTRA, map_location="cpu", weights_only=False)
        # A run resumed on a different world size keeps rank 0's trainer state for the new ranks.
        return extras[self.rank] if self.rank < len(extras) else extras[0]
