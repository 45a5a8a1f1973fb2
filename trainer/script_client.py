"""kiln's client for a script run in script mode (spec ``command:``, docs/user-code.md "Script mode").

A script kiln launches (under torchrun, one process per GPU or CPU slot, from its uploaded code's directory) may
import this module to tell kiln what it does, the same way kiln's own trainer does::

    from trainer import script_client as kiln

    ckpt = kiln.latest_checkpoint()  # the newest verified checkpoint, after a restart (None on a fresh start)
    start = ckpt.step if ckpt else 0
    for step in range(start + 1, kiln.steps() + 1):
        loss = train_one_step()
        kiln.report(step, loss, metrics={"lr": lr})  # a step: kiln ls/describe, the dashboard, SLA step time
        if step % 50 == 0 and kiln.rank() == 0:
            with kiln.checkpoint(step, loss=loss) as directory:  # committed under the fence when the block ends
                torch.save(state, directory / "state.pt")
        if kiln.should_stop():  # SIGTERM: preempted, cancelled or drained: checkpoint, then
            kiln.exit_stopped()

It imports nothing but the standard library and kiln's ``core`` (no torch, no database), and outside kiln (no
``KILN_RUN_DIR``) every call is harmless: ``report`` writes nothing, ``checkpoint`` commits into
``./kiln-checkpoints``.

Checkpoints are committed with the trainer's own protocol (``trainer.checkpoint.store``): the files are written in
a temporary directory never listed, fsynced and hashed into a manifest, and the directory is renamed to
``step_N`` only while this attempt's lease is valid and the fence still names its fencing token. An attempt that
lost the job (a newer attempt claimed it, or the reconciler declared it lost) never commits: ``checkpoint`` then
makes the script exit FENCED (``Fenced``, a ``SystemExit``), which kiln does not count as the script's failure.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

from core.fence import fence_names
from core.telemetry import Telemetry
from core.trainer_protocol import (
    ENV_CHECKPOINT_DIR,
    ENV_FENCING_TOKEN,
    ENV_KEEP_LAST,
    ENV_RUN_DIR,
    ENV_SEED,
    ENV_STEPS,
    EXIT_DIR,
    SCRIPT_INTENT_PREFIX,
    ExitCode,
    RecordKind,
)
from trainer.checkpoint.final import StorageUnwritable, save_durably
from trainer.checkpoint.store import (
    MANIFEST,
    FencedError,
    list_checkpoints,
    remove_checkpoint,
    sha256_file,
    step_dir_name,
    verify,
    write_manifest_and_commit,
)
from trainer.lease import LeaseExpired, LeaseGuard

__all__ = [
    "Checkpoint",
    "Fenced",
    "checkpoint",
    "checkpoint_dir",
    "evaluation",
    "exit_stopped",
    "latest_checkpoint",
    "local_rank",
    "rank",
    "report",
    "seed",
    "should_stop",
    "steps",
    "world_size",
]

DEFAULT_CHECKPOINT_DIR = "kiln-checkpoints"  # outside kiln (no KILN_CHECKPOINT_DIR): under the working directory
# What a checkpoint block's own writes meet when the storage, not the script, fails: read-only, full, over quota,
# an I/O error, a stale NFS handle. Any other OSError in the block (a missing subdirectory) is the script's.
STORAGE_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ESTALE})
T = TypeVar("T")


class Fenced(SystemExit):
    """This attempt may no longer commit: a newer attempt owns the job (FENCED), or the worker stopped renewing the
    lease (LEASE_EXPIRED). A ``SystemExit``: the script ends with kiln's code unless it catches ``BaseException``."""


@dataclass(frozen=True)
class Checkpoint:
    """A committed, verified checkpoint: its step, its directory (read your files from it) and the loss it saved."""

    step: int
    path: pathlib.Path
    loss: float | None


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def rank() -> int:
    """This process's global rank (torchrun's ``RANK``)."""
    return _int_env("RANK", 0)


def world_size() -> int:
    return _int_env("WORLD_SIZE", 1)


def local_rank() -> int:
    """This process's rank on its host: its GPU's index among the ones it sees."""
    return _int_env("LOCAL_RANK", 0)


def seed() -> int:
    """The spec's ``seed``."""
    return _int_env(ENV_SEED, 0)


def steps() -> int:
    """The spec's ``steps``: how far the job is asked to train."""
    return _int_env(ENV_STEPS, 100)


def checkpoint_dir() -> pathlib.Path:
    """The job's checkpoint directory, shared by all its attempts on every host."""
    return pathlib.Path(os.environ.get(ENV_CHECKPOINT_DIR) or DEFAULT_CHECKPOINT_DIR)


def _token() -> int | None:
    raw = os.environ.get(ENV_FENCING_TOKEN)
    return int(raw) if raw else None


class _Client:
    """The process's one connection to kiln: its telemetry file, its lease and its step clock."""

    def __init__(self) -> None:
        run_dir = os.environ.get(ENV_RUN_DIR)
        self.run_dir = pathlib.Path(run_dir) if run_dir else None
        self.tel = Telemetry(self.run_dir, rank()) if self.run_dir is not None else None
        self.token = _token()
        self.root = checkpoint_dir()
        self.lease = (
            LeaseGuard.from_env(
                token=self.token, fence_ok=lambda: fence_names(self.root, self.token), telemetry=self.tel
            )
            if self.tel is not None
            else None
        )
        self.last: tuple[int, float] | None = None  # (step, time.monotonic()) of the previous report
        self.overhead: str | None = None  # kiln's own work since the previous report ("save"): not step time
        self.stop = threading.Event()
        self.handler_installed = False
        if self.tel is not None:
            self.tel.diagnostic("SCRIPT_CLIENT", "kiln's script client connected", pid=os.getpid())

    def emit(self, kind: RecordKind, **fields: Any) -> None:
        if self.tel is not None:
            self.tel.emit(kind, **fields)

    def event(self, type_: str, message: str, **fields: Any) -> None:
        if self.tel is not None:
            self.tel.event(type_, message, **fields)

    def ensure_lease(self, what: str) -> None:
        """Return while this attempt may train and commit; make the script exit FENCED/LEASE_EXPIRED once not."""
        if self.lease is None:
            return
        try:
            self.lease.ensure(what)
        except LeaseExpired as exc:
            self.exit_with(ExitCode.LEASE_EXPIRED, "LEASE_EXPIRED_EXIT", str(exc))
        except FencedError as exc:
            self.exit_with(ExitCode.FENCED, "FENCED", str(exc))

    def exit_with(self, code: ExitCode, event: str, message: str) -> None:
        """Tell the rank's launcher (rank.entry) that this exit is kiln's, then raise it."""
        self.event(event, message)
        if self.run_dir is not None:
            target = self.run_dir / EXIT_DIR / f"{SCRIPT_INTENT_PREFIX}{rank()}"
            with contextlib.suppress(OSError):
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
                tmp.write_text(str(int(code)))
                os.replace(tmp, target)
        print(f"kiln: {message}", file=sys.stderr, flush=True)
        raise Fenced(int(code))


_CLIENT: _Client | None = None
_LOCK = threading.Lock()


def _client() -> _Client:
    global _CLIENT
    with _LOCK:
        if _CLIENT is None:
            _CLIENT = _Client()
        return _CLIENT


def report(
    step: int,
    loss: float | None,
    *,
    metrics: Mapping[str, float] | None = None,
    items_per_s: float | None = None,
    step_time_s: float | None = None,
) -> None:
    """One training step done: kiln shows it as the job's progress and loss (``kiln ls``, ``describe``, the
    dashboard's plots) and measures the SLA's step time from it. Report from every rank or from rank 0 only (kiln
    relays rank 0's). ``step_time_s`` defaults to the time since the previous report divided by the steps since
    (the first report of an attempt has none); ``metrics``: named numbers kept with the step."""
    c = _client()
    c.ensure_lease(f"step {step}")
    now = time.monotonic()
    if step_time_s is None and c.last is not None and step > c.last[0]:
        step_time_s = (now - c.last[1]) / (step - c.last[0])
    c.last = (step, now)
    overhead, c.overhead = c.overhead, None
    fields: dict[str, Any] = {
        "step": int(step),
        "loss": None if loss is None else float(loss),
        "step_time_s": step_time_s,
        "tokens_per_s": items_per_s,
        "overhead": overhead,
        "source": "script",
    }
    if metrics:
        fields["metrics"] = {str(k): float(v) for k, v in metrics.items()}
    c.emit(RecordKind.STEP, **fields)


def evaluation(step: int, metrics: Mapping[str, float]) -> None:
    """Named metrics of an evaluation (held-out accuracy, ...): the job's latest evaluation in ``describe``, an
    ``EVALUATION`` event on its timeline, the dashboard's evaluation plot and ``/metrics``."""
    _client().emit(RecordKind.EVAL, step=int(step), metrics={str(k): float(v) for k, v in metrics.items()})


@contextlib.contextmanager
def checkpoint(step: int, *, loss: float | None = None) -> Iterator[pathlib.Path]:
    """A new checkpoint of ``step``: write its files into the directory this yields; when the block ends without
    an exception it is committed (fsynced, hashed into a manifest, renamed to ``step_N``) under the fence, and the
    job's older checkpoints beyond ``checkpointing.keep_last`` are removed. Call it from one rank (rank 0) at a
    time. An exception in the block commits nothing; an attempt that lost the job commits nothing and exits
    FENCED (``Fenced``)."""
    c = _client()
    c.ensure_lease(f"checkpoint of step {step}")
    t0 = time.perf_counter()
    tmp = c.root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
    _durably(c, step, lambda: tmp.mkdir(parents=True))
    try:
        yield tmp
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in STORAGE_ERRNOS:  # the storage failed under the script's writes: kiln's failure, not its
            c.exit_with(
                ExitCode.STORAGE_ERROR,
                "CHECKPOINT_STORAGE_ERROR",
                f"checkpoint storage unwritable: writing the checkpoint of step {step}: {exc}",
            )
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = c.root / step_dir_name(step)
    meta = {"world_size": world_size(), "format": "script", "tier": "durable", "loss": loss}
    try:
        manifest = _durably(
            c,
            step,
            lambda: write_manifest_and_commit(
                tmp, final, step=int(step), token=c.token, meta=meta, lease=c.lease.ensure if c.lease else None
            ),
        )
    except LeaseExpired as exc:
        c.exit_with(ExitCode.LEASE_EXPIRED, "LEASE_EXPIRED_EXIT", str(exc))
        raise  # not reached: exit_with raises
    except FencedError as exc:
        c.exit_with(ExitCode.FENCED, "FENCED", str(exc))
        raise  # not reached: exit_with raises
    c.overhead = "save"
    c.emit(
        RecordKind.CHECKPOINT,
        step=int(step),
        path=str(final),
        bytes=sum(int(f["bytes"]) for f in manifest["files"].values()),
        sha256=sha256_file(final / MANIFEST),
        verified=True,
        format="script",
        tier="durable",
        loss=loss,
        token=c.token,
        stall_s=time.perf_counter() - t0,
        write_s=time.perf_counter() - t0,
    )
    keep = max(1, _int_env(ENV_KEEP_LAST, 3))
    committed = list_checkpoints(c.root)
    for _, path in committed[: max(0, len(committed) - keep)]:
        c.ensure_lease("removing an old checkpoint")
        if fence_names(c.root, c.token):
            remove_checkpoint(path)


def _durably(c: _Client, step: int, write: Callable[[], T]) -> T:
    """``write`` (kiln's own part of a commit), retried with backoff through a storage failure for
    ``KILN_FINAL_CHECKPOINT_RETRY_S``; still failing, the script exits STORAGE_ERROR: an infrastructure failure,
    restarted from the last verified checkpoint. Every commit of a script is retried, not only its last: the
    block that wrote the files cannot be told its checkpoint did not happen."""
    done: list[T] = []

    def attempt() -> BaseException | None:
        try:
            done.append(write())
        except OSError as exc:
            return exc
        return None

    try:
        save_durably(attempt, step=int(step), tel=c.tel, what="checkpoint")
    except StorageUnwritable as exc:
        c.exit_with(ExitCode.STORAGE_ERROR, "CHECKPOINT_STORAGE_ERROR", str(exc))
    return done[-1]


def latest_checkpoint(*, resume: bool = True) -> Checkpoint | None:
    """The newest checkpoint of the job whose files match its manifest (a corrupt one is skipped, with an event),
    or None. With ``resume`` (the default) kiln records that this attempt continues from it: the job's progress and
    loss become the checkpoint's until the script reports further steps."""
    c = _client()
    for step, path in reversed(list_checkpoints(c.root)):
        why = verify(path)
        if why is not None:
            c.event(
                "CHECKPOINT_CORRUPT",
                f"skipping checkpoint {path.name}: {why}",
                step=step,
                path=str(path),
                reason=why,
                tier="durable",
            )
            continue
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
        loss = manifest.get("loss")
        found = Checkpoint(step=step, path=path, loss=float(loss) if isinstance(loss, (int, float)) else None)
        if resume:
            c.last = None  # the restore's time is not a step's
            c.emit(
                RecordKind.RESUMED,
                step=step,
                path=str(path),
                tier="durable",
                loss=found.loss,
                token=manifest.get("fencing_token"),
                created=manifest.get("created"),
                bytes=sum(int(f["bytes"]) for f in manifest.get("files", {}).values()),
                sha256=sha256_file(path / MANIFEST),
            )
        return found
    return None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _CLIENT is not None:
        _CLIENT.stop.set()


def should_stop() -> bool:
    """True once kiln asked this attempt to stop (SIGTERM: preemption, cancel, a draining worker, the time limit).
    The first call installs the SIGTERM handler (from the main thread): until then SIGTERM ends the script at once,
    and its progress is its last checkpoint; after it the script has kiln's grace period
    (``KILN_STOP_GRACE_S``) to checkpoint and call ``exit_stopped()``."""
    c = _client()
    if not c.handler_installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
        c.handler_installed = True
    return c.stop.is_set()


def exit_stopped() -> None:
    """End the script after a stop request (``should_stop()``), once its checkpoint is committed: exit PREEMPTED,
    which kiln reads as the stop it asked for (the job goes back to the queue, is cancelled or times out)."""
    _client().exit_with(ExitCode.PREEMPTED, "PREEMPTED", "the script stopped on SIGTERM, as kiln asked")
