"""Persisting: a background thread copies committed local-tier checkpoints to the durable tier, one pending at
a time (a newer one supersedes one not yet started), hashed as copied; pruning keeps what it still copies."""

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

from core.telemetry import Telemetry
from core.trainer_protocol import RecordKind
from trainer.checkpoint.raw import _copy_hashed, writer_count
from trainer.checkpoint.store import (
    MANIFEST,
    FencedError,
    list_checkpoints,
    remove_checkpoint,
    sha256_file,
    write_manifest_and_commit,
)
from trainer.checkpoint.tiers import DURABLE, LOCAL, Tiers


class _Persist:
    """A local checkpoint waiting to be copied to the durable tier."""

    def __init__(self, step: int, path: pathlib.Path) -> None:
        self.step, self.path = step, path


class Persisting(Tiers):
    """The ``Checkpointer``'s persister and pruning (its state is set up by ``Checkpointer.__init__``)."""

    token: int | None
    keep_last: int
    lease: Callable[[str], None] | None
    tel: Telemetry
    persisted: int
    failures: int
    _failed: BaseException | None
    _cv: threading.Condition
    _pending: _Persist | None
    _active: _Persist | None
    _persist_error: BaseException | None
    _persister: threading.Thread | None
    _copy_pool: ThreadPoolExecutor | None
    _thread: threading.Thread | None

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
