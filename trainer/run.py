"""A rank's entry point: trains, turns each way a run can end into its exit code, and writes the ``EXIT`` record
as the rank's last."""

from __future__ import annotations

import os
import pathlib
import sys

import torch

from core.spec import JobSpec
from core.telemetry import Telemetry
from core.trainer_protocol import ENV_LAUNCHED_AT, ENV_RANK_STARTED_AT, ExitCode
from trainer.checkpoint import FencedError
from trainer.checkpoint.final import StorageUnwritable
from trainer.lease import LeaseExpired
from trainer.loop import Trainer
from trainer.parallel import DistEnv
from trainer.readback import TrainingDiverged
from trainer.user_error import UserError, is_collective_failure


def run(spec: JobSpec, run_dir: pathlib.Path, env: DistEnv) -> ExitCode:
    """Train; whatever happens, the last telemetry record of this rank is an ``EXIT`` event naming the exit
    code (torchrun itself exits 1 when any rank fails, hiding 75/77/...; the worker reads this instead)."""
    tel = Telemetry(run_dir, env.rank)
    # Where a start's time goes (a restart is timed from the worker's launch to the first resumed step).
    started, launched = os.environ.get(ENV_RANK_STARTED_AT), os.environ.get(ENV_LAUNCHED_AT)
    tel.diagnostic(
        "STARTED",
        "trainer started",
        process_start_ts=float(started) if started else None,
        launched_ts=float(launched) if launched else None,
    )
    code: int = 1
    error: str | None = None
    try:
        code = _run(spec, run_dir, env, tel)
        return ExitCode(code)
    except UserError as exc:  # the job fails at once, with this line as its reason
        code, error = ExitCode.USER_ERROR, exc.line
        print(f"kiln trainer: {exc.line}", file=sys.stderr, flush=True)
        return ExitCode.USER_ERROR
    except TrainingDiverged as exc:  # not retried either: the same data and numerics diverge the same way
        code, error = ExitCode.TOO_MANY_SPIKES, str(exc)
        print(f"kiln trainer: {exc}", file=sys.stderr, flush=True)
        return ExitCode.TOO_MANY_SPIKES
    except StorageUnwritable as exc:  # the host's storage, not the job: restarted from its last verified checkpoint
        code, error = ExitCode.STORAGE_ERROR, str(exc)[:2000]
        tel.event("CHECKPOINT_STORAGE_ERROR", error)
        print(f"kiln trainer: {exc}", file=sys.stderr, flush=True)
        return ExitCode.STORAGE_ERROR
    except BaseException as exc:  # a crash: python exits 1 (re-raised below, after the record)
        code, error = 1, f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        try:
            reason = ExitCode(code).name
        except ValueError:
            reason = "CRASH"
        tel.event("EXIT", f"exiting with {code} ({reason})", exit_code=int(code), reason=reason, error=error)
        tel.close()


def _run(spec: JobSpec, run_dir: pathlib.Path, env: DistEnv, tel: Telemetry) -> ExitCode:
    try:
        trainer = Trainer(spec, run_dir, env, tel)
        return trainer.train()
    except LeaseExpired as exc:
        tel.event("LEASE_EXPIRED_EXIT", str(exc))
        return ExitCode.LEASE_EXPIRED
    except FencedError as exc:
        tel.event("FENCED", str(exc))
        return ExitCode.FENCED
    except torch.OutOfMemoryError as exc:
        tel.event("OOM", f"out of memory: {exc}"[:2000])
        return ExitCode.OOM
    except RuntimeError as exc:  # DistBackendError is one
        if not is_collective_failure(exc):
            raise
        tel.event("NCCL_ERROR", f"collective failed: {exc}"[:2000])
        return ExitCode.NCCL_ERROR
