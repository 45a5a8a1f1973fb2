"""The ``Checkpointer``: asynchronous saves, the local and durable tiers, pruning, and choosing what to load.

Saving: ``save`` stages the state into reusable CPU buffers (for replicated state, ``trainer.checkpoint.raw``:
copied on a side stream on CUDA, so the next step's forward overlaps the copy; sharded FSDP2 state goes
through DCP, which stages its own) and returns; a background thread writes the files and commits them with
``trainer.checkpoint.store``'s protocol.  The next ``wait`` reports a failed write (``CHECKPOINT_FAILED``,
training goes on) and raises a fence (``FencedError``: this attempt must stop).

Loading: rank 0 takes the newest directory, across tiers, whose manifest verifies - corrupt ones are skipped
with an event - and every rank loads that one.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from core.fence import fence_names
from core.telemetry import Telemetry
from core.trainer_protocol import RecordKind
from trainer.checkpoint.persist import Persisting
from trainer.checkpoint.raw import (
    TENSORS,
    TREE,
    _FlatStager,
    _flatten,
    _write_hashed,
    writer_count,
)
from trainer.checkpoint.resume import Resuming
from trainer.checkpoint.store import (
    EXTRA,
    MANIFEST,
    FencedError,
    list_checkpoints,
    remove_checkpoint,
    sha256_file,
    step_dir_name,
    write_manifest_and_commit,
)
from trainer.checkpoint.tiers import DURABLE, LOCAL


class Checkpointer(Resuming, Persisting):
    """Saves and finds checkpoints in one or two tiers.

    ``root`` is the durable job checkpoint dir (shared by all attempts, the fence file beside it).  With
    ``local_root`` (a fast host-local dir: tmpfs or local NVMe) every checkpoint is committed there, and every
    ``persist_every``-th one (and every blocking one: the final and the preemption checkpoint) is copied to
    ``root`` by a background persister thread from the already committed local files - hashed as they are
    copied and compared with the local manifest, then committed with its own manifest and rename.  The
    training loop never waits for a persist except at a blocking save, a rollback and the end of the run."""

    def __init__(
        self,
        root: pathlib.Path,
        *,
        rank: int,
        world_size: int,
        token: int | None,
        keep_last: int,
        asynchronous: bool,
        sharded: bool,
        group: Any,
        device: torch.device,
        telemetry: Telemetry,
        local_root: pathlib.Path | None = None,
        persist_every: int = 1,
        lease: Callable[[str], None] | None = None,
    ) -> None:
        self.root = root
        self.lease = lease  # before every commit and deletion: returns only while this attempt may write
        self.local_root = local_root
        self.persist_every = max(1, persist_every)
        self.rank, self.world_size, self.token = rank, world_size, token
        self.keep_last = keep_last
        self.asynchronous = asynchronous
        self.sharded = sharded
        self.group = group  # gloo group reserved for checkpoint collectives (DCP runs them in a thread)
        self.device = device
        self.tel = telemetry
        self.stager = _FlatStager(device, writer_count())
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.saves = 0  # committed in the tier written to (local when tiered)
        self.persisted = 0  # local checkpoints copied to the durable tier
        self.failures = 0
        self._failed: BaseException | None = None  # the last failure wait()/wait_persist() reported (take_failure)
        self.last_save_stall_s = 0.0
        self._count = 0  # saves started by this attempt: every persist_every-th is made durable
        self._stalls: dict[int, float] = {}  # step -> its save()'s stall, read by the writer's record
        # The persister: one thread, one pending slot (a newer checkpoint supersedes one not yet started).
        self._cv = threading.Condition()
        self._pending = None
        self._active = None
        self._persist_error: BaseException | None = None
        self._persister: threading.Thread | None = None
        self._copy_pool: ThreadPoolExecutor | None = None
        self._staging_said = False
        self._verifying: threading.Thread | None = None  # verify_ahead's thread
        self._verified: dict[pathlib.Path, tuple[tuple[Any, ...] | None, str | None]] = {}
        if rank == 0:
            for tier_root in self.roots():
                tier_root.mkdir(parents=True, exist_ok=True)
                for p in tier_root.glob(".tmp-*"):  # leftovers of a crashed writer never become checkpoints
                    shutil.rmtree(p, ignore_errors=True)

    # ---- saving ---------------------------------------------------------------------------------------
    def _state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Lay out the staging buffers now (start-up, once the optimizer state exists) rather than on the first
        save, allocating them in a thread while training goes on, and start the writer threads."""
        if self.sharded or self.rank != 0:
            return  # DCP stages its own CPU copies; in a replicated run rank 0 writes everything
        leaves: list[torch.Tensor] = []
        _flatten(self._state(model, optimizer), leaves, {})
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.stager.files, thread_name_prefix="kiln-ckpt-io")
        self.stager.layout(leaves, background=True)

    def _say_staged(self) -> None:
        """``CHECKPOINT_STAGING``, once, from the training thread at the first save (the allocating thread must not
        write telemetry: a record after the rank's ``EXIT`` would hide its exit code from the worker)."""
        if self._staging_said:
            return
        self._staging_said = True
        self.tel.diagnostic(
            "CHECKPOINT_STAGING",
            f"staging buffers: {self.stager.nbytes} bytes in "
            f"{len(self.stager.buffers)} files, allocated in {self.stager.alloc_s:.2f}s (beside the training)",
            bytes=self.stager.nbytes,
            files=len(self.stager.buffers),
            alloc_s=self.stager.alloc_s,
            pinned=self.device.type == "cuda",
        )

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any],
        *,
        blocking: bool = False,
    ) -> None:
        """Collective: every rank calls it at the same step.  Returns once the state is staged; with
        ``blocking`` (or a synchronous spec) once it is committed - and, when tiered, durable too."""
        t0 = time.perf_counter()
        self.wait()  # buffers are reused: the previous write must be finished
        self._count += 1
        persist = self.local_root is not None and (blocking or self._count % self.persist_every == 0)
        extras = self._gather(extra)
        tmp = self.write_root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
        # The loss of the step saved, readable without loading the state: what the job's record must show
        # for it (a resumed attempt that trains no further step reports this one).
        meta = {
            "world_size": self.world_size,
            "format": "dcp" if self.sharded else "raw",
            "torch": torch.__version__,
            "tier": LOCAL if self.local_root is not None else DURABLE,
            "loss": extra.get("loss"),
        }
        if self.sharded:
            self._save_sharded(step, model, optimizer, extras, tmp, meta, persist)
        else:
            self._save_replicated(step, model, optimizer, extras, tmp, meta, persist)
        self.last_save_stall_s = time.perf_counter() - t0
        self._stalls[step] = self.last_save_stall_s
        if blocking or not self.asynchronous:
            self.wait()
            if persist:
                self.wait_persist()

    def _gather(self, extra: dict[str, Any]) -> list[dict[str, Any]]:
        if self.world_size == 1:
            return [extra]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, extra, group=self.group)
        return out

    def _save_replicated(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        extras: list[dict[str, Any]],
        tmp: pathlib.Path,
        meta: dict[str, Any],
        persist: bool,
    ) -> None:
        if self.rank != 0:
            return  # replicated state: rank 0 holds all of it
        if self._pool is None:
            self.prepare(model, optimizer)  # (a Checkpointer used without prepare(): pays it here)
        tree = self.stager.stage(self._state(model, optimizer))
        self._say_staged()
        pool = self._pool
        assert pool is not None

        def write() -> None:
            t0 = time.perf_counter()
            self.stager.wait_copy()
            tmp.mkdir(parents=True)
            jobs = {
                f"data_{i}.bin": pool.submit(_write_hashed, tmp / f"data_{i}.bin", buf)
                for i, buf in enumerate(self.stager.buffers)
            }
            # The small files go out while the data files stream; the commit fsyncs and hashes them.
            (tmp / TENSORS).write_text(
                json.dumps([{k: v for k, v in e.items() if k != "index"} for e in self.stager.entries])
            )
            torch.save(tree, tmp / TREE)
            torch.save(extras, tmp / EXTRA)
            written = {name: job.result() for name, job in jobs.items()}
            self._commit(step, tmp, meta, written, t0, persist)

        self._start(write)

    def _save_sharded(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        extras: list[dict[str, Any]],
        tmp: pathlib.Path,
        meta: dict[str, Any],
        persist: bool,
    ) -> None:
        import torch.distributed.checkpoint as dcp

        opts = StateDictOptions(cpu_offload=True)  # a CPU snapshot of this rank's shards
        state = {
            "model": get_model_state_dict(model, options=opts),
            "optim": get_optimizer_state_dict(model, optimizer, options=opts),
        }
        if self.rank == 0:
            tmp.mkdir(parents=True)
        tmp_name = [tmp.name]
        if self.world_size > 1:
            dist.broadcast_object_list(tmp_name, src=0, group=self.group)
        tmp = self.write_root / tmp_name[0]

        def write() -> None:
            t0 = time.perf_counter()
            # DCP's collectives run here, on the checkpoint group, never on the training group.
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp)), process_group=self.group)
            if self.rank == 0:  # DCP's finish gathered every rank's writes: all shards are on disk
                torch.save(extras, tmp / EXTRA)
                self._commit(step, tmp, meta, None, t0, persist)

        self._start(write)

    def _commit(
        self,
        step: int,
        tmp: pathlib.Path,
        meta: dict[str, Any],
        written: dict[str, tuple[int, str]] | None,
        t0: float,
        persist: bool,
    ) -> None:
        final = self.write_root / step_dir_name(step)
        manifest = write_manifest_and_commit(
            tmp, final, step=step, token=self.token, meta=meta, written=written, fence_root=self.root, lease=self.lease
        )
        total = sum(f["bytes"] for f in manifest["files"].values())
        # stall_s: how long save() held the training loop (waiting for the previous write + staging);
        # write_s: staging copy, data files, fsyncs, manifest and rename, in the background.
        fields: dict[str, Any] = {
            "step": step,
            "path": str(final),
            "bytes": total,
            "sha256": sha256_file(final / MANIFEST),
            "verified": True,
            "format": meta.get("format"),
            "tier": meta["tier"],
            "loss": meta.get("loss"),
            "token": self.token,
            "stall_s": self._stalls.pop(step, None),  # None if the write beat save()'s return
            "write_s": time.perf_counter() - t0,
        }
        if self.local_root is None:
            self.tel.emit(RecordKind.CHECKPOINT, **fields)
            self.prune(self.root)
            return
        # Local commits are events, not ``checkpoint`` records: the control plane counts a ``checkpoint``
        # record as the job's progress on durable storage (what survives a move to another host).
        self.tel.event(
            "CHECKPOINT_LOCAL",
            f"checkpoint at step {step} committed to the local tier" + (" (to be persisted)" if persist else ""),
            persist=persist,
            **fields,
        )
        if persist:
            self._enqueue_persist(step, final)
        self.prune(self.local_root)

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
        """Block until the in-flight write (if any) is committed; re-raise what went wrong in it (and a
        fence seen by the persister)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            if isinstance(err, FencedError):
                raise err
            self.failures += 1
            self._failed = err
            self.tel.event(
                "CHECKPOINT_FAILED",
                f"checkpoint write failed: {err!r}",
                error=repr(err),
                tier=LOCAL if self.local_root is not None else DURABLE,
            )
        self._raise_persist_error()

    # ---- persisting (local tier -> durable tier) ------------------------------------------------------

    def take_failure(self) -> BaseException | None:
        """The last write or persist failure reported since the previous call (None: none), then forgotten. A
        failed save is only an event to the training loop; the final save asks, since the job's success needs it."""
        err, self._failed = self._failed, None
        return err

    def finish(self) -> None:
        """End of the run: every write committed, every persist durable."""
        self.wait()
        self.wait_persist()

    def before_optimizer_step(self) -> None:
        if self._thread is not None:
            self.stager.order_before_update()

    def delete_from(self, step: int) -> list[int]:
        """Rollback: drop checkpoints at or after ``step`` in every tier (they hold the state being rolled
        back over)."""
        self.wait()
        self.wait_persist()
        removed: set[int] = set()
        if self.rank == 0:
            # An attempt that may no longer commit must not delete what a newer attempt committed either.
            if self.lease is not None:
                self.lease(f"rollback to before step {step}")
            if not fence_names(self.root, self.token):
                raise FencedError(f"fence no longer names token {self.token}; rollback not done")
            for tier_root in self.roots():
                for s, path in list_checkpoints(tier_root):
                    if s >= step:
                        remove_checkpoint(path)
                        removed.add(s)
        if self.world_size > 1:
            dist.barrier(group=self.group)
        return sorted(removed)

    # ---- loading --------------------------------------------------------------------------------------
