"""The worker (root) never writes, reads or waits through what a job planted in its own directories.

An attempt's run and checkpoint directories belong to its team's user (workers/attempt_user.py), and the worker
keeps writing there while the trainer runs (the lease, every heartbeat; the fence) and reading (telemetry, exit
codes). Before: the lease was staged at a fixed name (``.lease.tmp``), so a trainer that planted a link there had
root overwrite any file of the host; a FIFO at a telemetry file or at the fence blocked the worker (or the
scheduler's reconciler) forever on open."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from core.fence import UNREADABLE, Lease, read_fence, read_lease, write_fence, write_lease
from core.trainer_protocol import FENCE_FILE, LEASE_FILE, TELEMETRY_DIR
from workers.supervisor import TrainerProcess
from workers.telemetry_relay import TelemetryTail


def test_the_lease_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "a-root-file"
    victim.write_text("intact")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lease = run_dir / LEASE_FILE
    for planted in (lease, run_dir / f".{LEASE_FILE}.tmp"):  # the file, and where it was once staged
        planted.symlink_to(victim)
    write_lease(lease, Lease(token=3, expires=10.0, lease_s=5.0))
    assert victim.read_text() == "intact" and not lease.is_symlink()
    assert read_lease(lease) == Lease(token=3, expires=10.0, lease_s=5.0)
    assert lease.stat().st_mode & 0o777 == 0o644  # the attempt's user reads it, whatever the worker's umask


def test_the_fence_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "a-root-file"
    victim.write_text("intact")
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    (checkpoints / FENCE_FILE).symlink_to(victim)
    assert read_fence(checkpoints) == UNREADABLE  # a link names no token: it is not followed
    write_fence(checkpoints, 7)
    assert victim.read_text() == "intact" and read_fence(checkpoints) == "7"


def _returns_promptly(fn: object) -> object:
    """Run ``fn`` in a thread; an open() that blocks on a FIFO would never return."""
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)  # type: ignore[operator]
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the worker blocked on a FIFO the job planted"
    return box[0]


@pytest.mark.timeout(60)
def test_a_fifo_blocks_neither_the_telemetry_tail_nor_the_fence_nor_exit_codes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / TELEMETRY_DIR).mkdir(parents=True)
    os.mkfifo(run_dir / TELEMETRY_DIR / "rank0.jsonl")
    assert _returns_promptly(TelemetryTail(run_dir).read_new) == []
    (run_dir / "exit").mkdir()
    os.mkfifo(run_dir / "exit" / "rank0")
    proc = TrainerProcess(["true"], env={}, log_path=tmp_path / "log", run_dir=run_dir, cwd=run_dir)
    assert _returns_promptly(proc.rank_exit_codes) == {}
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    os.mkfifo(checkpoints / FENCE_FILE)
    assert _returns_promptly(lambda: read_fence(checkpoints)) == UNREADABLE
