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

import contextlib
import json
import os
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
    set_model_state_dict,
    set_optimizer_state_dict,
)

from core.fence import fence_names
from core.telemetry import Telemetry
from core.trainer_protocol import RecordKind
from trainer.checkpoint.raw import (
    TENSORS,
    TREE,
    _copy_hashed,
    _FlatStager,
    _flatten,
    _write_hashed,
    load_raw,
    writer_count,
)
from trainer.checkpoint.store import (
    EXTRA,
    MANIFEST,
    PREFIX,
    FencedError,
    list_checkpoints,
    remove_checkpoint,
    sha256_file,
    step_dir_name,
    verify,
    write_manifest_and_commit,
)

LOCAL, DURABLE = "local", "durable"


class _Persist:
    """A local checkpoint waiting to be copied to the durable tier."""

    def __init__(self, step: int, path: pathlib.Path) -> None:
        self.step, self.path = step, path


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


class Checkpointer:
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
        self._pending: _Persist | None = None
        self._active: _Persist | None = None
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

    def roots(self) -> list[pathlib.Path]:
        return [self.root] if self.local_root is None else [self.local_root, self.root]

    @property
    def write_root(self) -> pathlib.Path:
        """Where save() commits: the local tier when there is one."""
        return self.local_root if self.local_root is not None else self.root

    def tier_of(self, path: pathlib.Path) -> str:
        return LOCAL if self.local_root is not None and path.parent == self.local_root else DURABLE

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
    def _enqueue_persist(self, step: int, path: pathlib.Path) -> None:
        with self._cv:
            if self._pending is not None:
                old = self._pending
                self.tel.event(
                    "CHECKPOINT_PERSIST_SUPERSEDED",
                    f"step {old.step} not yet copied to the durable tier when step {step} was due: "
                    "the newer one goes instead",
                    step=old.step,
                    superseded_by=step,
                    tier=DURABLE,
                )
            self._pending = _Persist(step, path)
            if self._persister is None:
                self._copy_pool = ThreadPoolExecutor(
                    max_workers=writer_count(), thread_name_prefix="kiln-ckpt-persist-io"
                )
                self._persister = threading.Thread(target=self._persist_loop, name="kiln-ckpt-persister", daemon=True)
                self._persister.start()
            self._cv.notify_all()

    def _persist_loop(self) -> None:
        while True:
            with self._cv:
                while self._pending is None:
                    self._cv.wait()
                job, self._pending = self._pending, None
                self._active = job
            try:
                self._persist(job)
            except BaseException as exc:
                with self._cv:
                    self._persist_error = exc
            finally:
                with self._cv:
                    self._active = None
                    # The local copy was kept past keep_last while it was being copied: it may go now (before
                    # wait_persist() returns, so a finished run leaves keep_last in each tier).
                    if self.local_root is not None:
                        self.prune(self.local_root)
                    self._cv.notify_all()

    def _persist(self, job: _Persist) -> None:
        t0 = time.perf_counter()
        src = job.path
        manifest = json.loads((src / MANIFEST).read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
        tmp = self.root / f".tmp-{src.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            pool = self._copy_pool
            assert pool is not None
            # Largest first, so the data files' copies start together and the small files fill in.
            names = sorted(files, key=lambda n: -int(files[n]["bytes"]))
            jobs = {n: pool.submit(_copy_hashed, src / n, tmp / n) for n in names}
            written = {n: j.result() for n, j in jobs.items()}
            bad = [n for n, (size, sha) in written.items() if size != files[n]["bytes"] or sha != files[n]["sha256"]]
            if bad:
                self.tel.event(
                    "CHECKPOINT_CORRUPT",
                    f"local checkpoint {src.name} changed after its commit ({bad[0]}): not persisted",
                    step=job.step,
                    path=str(src),
                    reason=f"sha256 mismatch in {bad[0]}",
                    tier=LOCAL,
                )
                raise RuntimeError(f"local checkpoint {src} no longer matches its manifest")
            meta = {k: v for k, v in manifest.items() if k not in ("step", "fencing_token", "created", "files")}
            meta.update(tier=DURABLE, persisted_from=str(src), local_sha256=sha256_file(src / MANIFEST))
            final = self.root / src.name
            durable = write_manifest_and_commit(
                tmp, final, step=job.step, token=self.token, meta=meta, written=written, lease=self.lease
            )
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.persisted += 1
        self.tel.emit(
            RecordKind.CHECKPOINT,
            step=job.step,
            path=str(final),
            bytes=sum(f["bytes"] for f in durable["files"].values()),
            sha256=sha256_file(final / MANIFEST),
            verified=True,
            format=durable.get("format"),
            tier=DURABLE,
            source=str(src),
            persist_s=time.perf_counter() - t0,
            stall_s=None,
            loss=durable.get("loss"),
            token=self.token,
        )
        self.prune(self.root)

    def io_in_flight(self) -> str | None:
        """kiln's own checkpoint I/O running beside training now: ``persist`` (a copy to the durable tier),
        ``write`` (a save being written), or None. Steps it overlaps are marked so that a step-time SLA compares
        the job's steps with each other, not with kiln's I/O."""
        with self._cv:
            if self._active is not None or self._pending is not None:
                return "persist"
        if self._thread is not None and self._thread.is_alive():
            return "write"
        return None

    def wait_persist(self) -> None:
        """Block until no persist is pending or running; re-raise a fence it hit."""
        with self._cv:
            while self._pending is not None or self._active is not None:
                self._cv.wait()
        self._raise_persist_error()

    def _raise_persist_error(self) -> None:
        with self._cv:
            err, self._persist_error = self._persist_error, None
        if err is None:
            return
        if isinstance(err, FencedError):
            raise err
        self.failures += 1
        self._failed = err
        self.tel.event("CHECKPOINT_FAILED", f"copy to the durable tier failed: {err!r}", error=repr(err), tier=DURABLE)

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

    def prune(self, root: pathlib.Path | None = None) -> None:
        """Keep the newest ``keep_last`` in ``root`` (default: every tier); a local checkpoint waiting to be
        (or being) persisted is kept until its copy is done."""
        for tier_root in [root] if root is not None else self.roots():
            with self._cv:
                busy = {j.path for j in (self._pending, self._active) if j is not None}
            ckpts = list_checkpoints(tier_root)
            for _, path in ckpts[: max(0, len(ckpts) - self.keep_last)]:
                if path not in busy:
                    remove_checkpoint(path)

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
