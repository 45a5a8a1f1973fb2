"""Launch a claimed node's trainer (its directories, environment, confinement and process), supervise it to its end
and report how it ended."""

from __future__ import annotations

import contextlib
import json
import logging

from core import compile_cache
from core.fence import job_checkpoint_dir, write_fence
from core.lifecycle import ExitClass
from core.private import private_dir, replace_file
from core.settings import Settings
from core.states import MpsState
from core.trainer_protocol import ENV_TEST_HOOKS, LEASE_FILE
from workers import attempt_setup, isolation, mps
from workers.attempt_env import attempt_env, local_tier_dir
from workers.attempt_setup import AttemptDirs, CodeRefused
from workers.claimed import Claimed
from workers.datasets import DatasetUnavailable
from workers.exit_classes import Outcome
from workers.isolation import Isolation, Limits
from workers.runner import AttemptRunner
from workers.supervisor import TrainerProcess, launch_command
from workers.worker_state import METRICS

log = logging.getLogger(__name__)


def run_claimed(
    *,
    claimed: Claimed,
    claimed_at: float,
    attempt_id: int,
    fencing_token: int,
    node_rank: int,
    host: str,
    settings: Settings,
) -> str:
    """Launch the claimed node's trainer, supervise it to its end and report; returns the exit class. Counted in
    the worker's metrics (attempts running, and ended by outcome)."""
    METRICS.attempts_running.inc()
    outcome = "error"
    try:
        outcome = _run_claimed(
            claimed=claimed,
            claimed_at=claimed_at,
            attempt_id=attempt_id,
            fencing_token=fencing_token,
            node_rank=node_rank,
            host=host,
            settings=settings,
        )
        return outcome
    finally:
        METRICS.attempts_running.dec()
        METRICS.attempts.labels(outcome).inc()


def _node_suffix(node_rank: int) -> str:
    """How a gang's other nodes name their run directory and log beside node 0's."""
    return "" if node_rank == 0 else f".node{node_rank}"


def _attempt_dirs(settings: Settings, claimed: Claimed, node_rank: int) -> AttemptDirs:
    """Where this node's attempt runs and what it reads and writes: run directory, checkpoints, compile caches (the
    job's, its team's only, the shared one if the admin made it) and its local tier."""
    storage = settings.resolved_storage_dir.resolve()
    shared_cache = compile_cache.shared_dir(storage) if compile_cache.shared_dir(storage).is_dir() else None
    local_dir = local_tier_dir(settings, claimed)
    return AttemptDirs(
        storage=storage,
        run_dir=storage / "runs" / str(claimed.job_id) / f"{claimed.attempt_number}{_node_suffix(node_rank)}",
        checkpoint_dir=job_checkpoint_dir(storage, claimed.job_id),
        compile_dir=storage / "compile_cache" / str(claimed.job_id),
        team_cache_dir=compile_cache.team_dir(storage, claimed.team_id),  # this team's only: never another's
        shared_cache_dir=shared_cache,
        local_dir=local_dir,
        local_root=settings.local_tier_dir.resolve() if local_dir and settings.local_tier_dir else None,
    )


def _run_claimed(
    *,
    claimed: Claimed,
    claimed_at: float,
    attempt_id: int,
    fencing_token: int,
    node_rank: int,
    host: str,
    settings: Settings,
) -> str:
    dirs = _attempt_dirs(settings, claimed, node_rank)
    log_name = f"{claimed.attempt_number}{_node_suffix(node_rank)}.log"
    slots = claimed.slots(node_rank)
    argv, launch_env = launch_command(
        nproc_per_node=slots,
        spec_path=dirs.run_dir / "spec.json",
        run_dir=dirs.run_dir,
        rendezvous=claimed.rendezvous,
        script=bool(claimed.spec.get("command")),
    )
    env = (
        attempt_env(
            claimed,
            attempt_id=attempt_id,
            token=fencing_token,
            checkpoint_dir=dirs.checkpoint_dir,
            compile_dir=dirs.compile_dir,
            lease_file=dirs.run_dir / LEASE_FILE,
            local_dir=dirs.local_dir,
            final_retry_s=settings.final_checkpoint_retry_s,
            team_cache_dir=dirs.team_cache_dir,
            shared_cache_dir=dirs.shared_cache_dir,
            ckpt_writers=settings.ckpt_writers,
        )
        | launch_env
    )
    host_isolation = isolation.current(host, settings)
    limits = host_isolation.limits(claimed.spec, slots)
    log_path = dirs.storage / "logs" / str(claimed.job_id) / log_name
    proc = TrainerProcess(
        argv, env=env, log_path=log_path, run_dir=dirs.run_dir, cwd=dirs.run_dir, log_gid=settings.storage_gid
    )
    runner = AttemptRunner(
        attempt_id=attempt_id,
        token=fencing_token,
        node_rank=node_rank,
        host=host,
        settings=settings,
        claimed=claimed,
        proc=proc,
    )
    try:
        # Everything between the claim and a running trainer: a failure here must end the attempt now (as an
        # infrastructure failure on this host), not leave it RUNNING until its lease runs out.
        _start(runner, dirs, host_isolation, limits, claimed_at=claimed_at)
    except Exception as exc:
        return _launch_failed(runner, exc)
    return _supervise(runner)


def _start(
    runner: AttemptRunner, dirs: AttemptDirs, host_isolation: Isolation, limits: Limits, *, claimed_at: float
) -> None:
    """Prepare the node's directories, fence, lease, spec and sandbox, then start its trainer confined."""
    proc, claimed, token = runner.proc, runner.claimed, runner.token
    hooks = proc.env.get(ENV_TEST_HOOKS)  # as the worker set it: the setup below adds the job's own variables
    for d in (dirs.run_dir, dirs.compile_dir, dirs.team_cache_dir, dirs.local_dir):
        if d is not None:
            private_dir(d)
    if claimed.placement[runner.node_rank].get("share") and (
        mps.DAEMON is None or mps.DAEMON.state != MpsState.RUNNING
    ):
        raise RuntimeError("this host's MPS daemon is not running: a GPU share cannot be enforced")
    write_fence(dirs.checkpoint_dir, token)
    runner.renew_lease(claimed_at)  # the lease the claim granted, before any rank starts
    replace_file(dirs.run_dir / "spec.json", json.dumps(claimed.spec, indent=2, sort_keys=True))
    attempt_setup.prepare(proc, claimed, dirs, host_isolation, runner.settings)
    proc.log_line(f"attempt {claimed.attempt_number} (token {token}) node {runner.node_rank} on {runner.host}")
    if hooks is not None:
        proc.log_line(f"TEST HOOKS ACTIVE ({ENV_TEST_HOOKS} is set on this worker): {hooks}")
    proc.confinement = host_isolation.confine(f"attempt-{runner.attempt_id}{_node_suffix(runner.node_rank)}", limits)
    proc.log_line(
        f"limits ({host_isolation.mechanism}): {limits.memory_bytes} bytes of host memory, {limits.pids} processes"
    )
    proc.start()


def _launch_failed(runner: AttemptRunner, exc: Exception) -> str:
    """End the attempt now: the user's to fix (a restart fails the same way), or this host's failure."""
    if isinstance(exc, DatasetUnavailable | CodeRefused):
        forced = Outcome(ExitClass.USER_ERROR, f"user error: {exc}"[:480])
    else:
        log.exception("could not launch attempt %s", runner.attempt_id)
        forced = Outcome(ExitClass.INFRASTRUCTURE, f"launch failed on {runner.host}: {exc!r}"[:480])
    with contextlib.suppress(Exception):
        runner.proc.log_line(f"could not launch the trainer: {forced.reason}")
    try:
        return runner.finish(127, forced).exit_class.value
    finally:
        _release(runner.proc)


def _supervise(runner: AttemptRunner) -> str:
    """Supervise the started trainer to its end and report how it ended."""
    proc = runner.proc
    try:
        code = runner.supervise()
    except BaseException:
        proc.kill_tree()
        _release(proc)
        raise
    proc.wait()
    outcome = runner.finish(code)
    _release(proc)
    log.info(
        "attempt %s node %s: %s (%s)", runner.attempt_id, runner.node_rank, outcome.exit_class.value, outcome.reason
    )
    return outcome.exit_class.value


def _release(proc: TrainerProcess) -> None:
    if proc.confinement is not None:
        with contextlib.suppress(Exception):
            proc.confinement.release()
