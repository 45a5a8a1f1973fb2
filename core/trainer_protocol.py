"""The contract between a worker and the trainer processes it supervises.

The trainer never imports the API or the database. The worker launches

    torchrun --nproc-per-node N [--nnodes M --rdzv-...] -m trainer --spec SPEC.json --run-dir RUN_DIR

with the environment below, reads the JSON-lines telemetry the ranks append to ``RUN_DIR/telemetry/``,
and classifies the exit code. Pure Python: imported by both sides.
"""

from __future__ import annotations

import enum
from typing import Any

# Environment variables the worker sets for every rank.
ENV_FENCING_TOKEN = "KILN_FENCING_TOKEN"  # int; the attempt's fencing token
ENV_CHECKPOINT_DIR = "KILN_CHECKPOINT_DIR"  # the job's checkpoints, shared by all its attempts
ENV_COMPILE_CACHE_DIR = "KILN_COMPILE_CACHE_DIR"  # compile artifacts, beside the checkpoints
# The team's compile cache on kiln's storage (read-write: the trainer publishes there; core.compile_cache) and the
# admin's shared one (read-only), each named by the worker; the sandbox binds those two directories only.
ENV_TEAM_COMPILE_CACHE_DIR = "KILN_TEAM_COMPILE_CACHE_DIR"
ENV_SHARED_COMPILE_CACHE_DIR = "KILN_SHARED_COMPILE_CACHE_DIR"
# torch's own cache dirs, which the trainer points into the job's compile dir (trainer.builders); a worker's own
# values must not reach an attempt, nor one test's the next
COMPILER_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# The job's own directory in the host's fast local tier; set only when the spec asks for the tier
# (``checkpointing.local_tier``) and the host has one.
ENV_LOCAL_CHECKPOINT_DIR = "KILN_LOCAL_CHECKPOINT_DIR"
ENV_MEMORY_FRACTION = "KILN_GPU_MEMORY_FRACTION"  # float in (0, 1]; QoS memory cap
ENV_JOB_ID = "KILN_JOB_ID"
ENV_ATTEMPT_ID = "KILN_ATTEMPT_ID"
ENV_RANK_STARTED_AT = "KILN_RANK_STARTED_AT"  # unix time the rank's entry point began (set by the rank itself)
ENV_LAUNCHED_AT = "KILN_LAUNCHED_AT"  # unix time the worker launched the attempt (before its sandbox was set up)
# The team's own code (spec ``code``), unpacked and verified by the worker: the trainer imports its entry point.
ENV_CODE_DIR = "KILN_CODE_DIR"
# The job's datasets (spec ``datasets``): a JSON object, name -> the directory the attempt reads it at (read-only
# where the worker can mount it so: workers/datasets.py).
ENV_DATASETS = "KILN_DATASETS"
ENV_LEASE_FILE = "KILN_LEASE_FILE"  # RUN_DIR/lease: this node's lease, renewed by its worker (core.fence)
# Seconds a final checkpoint that failed to commit is retried (Settings.final_checkpoint_retry_s); the trainer's and
# the script client's default when the variable is absent (a bare run with no worker).
ENV_FINAL_CHECKPOINT_RETRY_S = "KILN_FINAL_CHECKPOINT_RETRY_S"
DEFAULT_FINAL_CHECKPOINT_RETRY_S = 120.0
# Writer threads (and data files) of each checkpoint a rank saves (Settings.ckpt_writers, passed by the worker only
# when the operator set it); absent: min(8, the rank's cores) (trainer.checkpoint.raw.writer_count).
ENV_CKPT_WRITERS = "KILN_CKPT_WRITERS"
# Script mode (spec ``command``, trainer.script_client): what kiln's trainer reads from the spec, given to a script.
ENV_RUN_DIR = "KILN_RUN_DIR"  # the attempt's run directory (telemetry, exit codes); the script's cwd is the code
ENV_SEED = "KILN_SEED"  # the spec's seed
ENV_STEPS = "KILN_STEPS"  # the spec's steps: how far the script is asked to train
ENV_KEEP_LAST = "KILN_CHECKPOINT_KEEP_LAST"  # the spec's checkpointing.keep_last
# Tests only: fault injection (a JSON object of ``trainer.config.TestHooks`` fields). Set in a worker's own
# environment by the test harness, passed by that worker to the ranks it launches; production never sets it, and
# no job spec can reach it.
ENV_TEST_HOOKS = "KILN_TEST_HOOKS"

# The checkpoint directory holds this file; its content is the current fencing token (decimal).
# A rank commits a checkpoint (the final rename) only while the file still names its own token and its lease
# (LEASE_FILE in the run dir) has not expired; see core.fence.
FENCE_FILE = "fence"
LEASE_FILE = "lease"

TELEMETRY_DIR = "telemetry"  # RUN_DIR/telemetry/rank{R}.jsonl, one JSON object per line
# Script mode: RUN_DIR/exit/script-rank{R} holds the exit code kiln's client chose for the script (FENCED,
# LEASE_EXPIRED, PREEMPTED) just before it made the script exit with it; any other exit is the script's own.
EXIT_DIR = "exit"  # RUN_DIR/exit/rank{R}: each rank's exit code, written by rank.entry
SCRIPT_INTENT_PREFIX = "script-rank"


class ExitCode(enum.IntEnum):
    """Exit codes of ``python -m trainer``; anything else is an unclassified crash."""

    SUCCEEDED = 0
    USER_ERROR = 2  # bad spec or hyperparameters: restarting will not help
    PREEMPTED = 75  # SIGTERM honoured: a checkpoint was committed, then exit (EX_TEMPFAIL)
    FENCED = 76  # the fencing token is no longer current: another attempt owns the job
    TOO_MANY_SPIKES = 77  # the loss-spike guard gave up
    OOM = 78
    NCCL_ERROR = 79
    LEASE_EXPIRED = 80  # the worker stopped renewing the lease (frozen, cut off, dead): no commit, exit
    STORAGE_ERROR = 81  # the final checkpoint could not be made durable within its retry window: infrastructure


class RecordKind(enum.StrEnum):
    """``kind`` of a telemetry line. Every line also has ``ts`` (unix seconds) and ``rank``."""

    # step, loss, grad_norm, tokens_per_s, step_time_s, mfu, mem_allocated_bytes, mem_peak_bytes, and overhead:
    # kiln's own work during the step (persist, save, write, restore) or null
    STEP = "step"
    HEARTBEAT = "heartbeat"  # alive, cuda_ok, nccl_error, grad_sync_latency_s
    EVENT = "event"  # type (e.g. FALLBACK_COMPILE_TIMEOUT, LOSS_SPIKE), message, fields {...}
    CHECKPOINT = "checkpoint"  # step, path, bytes, sha256, verified
    GPU_SAMPLE = "gpu_sample"  # NVML: gpu uuid, util, mem, pcie/nvlink rx/tx bytes/s (absent -> null)
    MEMORY_PREDICTION = "memory_prediction"  # predicted_peak_bytes, breakdown {...}
    RESUMED = "resumed"  # step resumed from (first training step after resume follows)
    DONE = "done"  # final_loss, steps, eval (the last evaluation's metrics, or null)
    EVAL = "eval"  # step, metrics {name: value}: the user's evaluation (team code that defines ``evaluate``)
    # type, message, fields {...}: the trainer's own measurements for benchmarks and post-mortems (when its
    # start began, the checkpoint staging's size); kept in the telemetry file, not relayed to the job's timeline
    DIAGNOSTIC = "diagnostic"


def command_exit_code(event_type: str, data: dict[str, Any] | None) -> tuple[int, int] | None:
    """(attempt, code) where an event is rank 0's EXIT of a team's own command (script mode: ``returncode``): the
    code a person expects beside an attempt, where the attempt itself records kiln's (USER_ERROR for any failing
    command). None for any other event, and for a recipe's EXIT, whose code is the trainer's own."""
    data = data or {}
    code, attempt = data.get("returncode"), data.get("attempt")
    if event_type != "EXIT" or data.get("rank", 0) != 0 or not isinstance(code, int) or not isinstance(attempt, int):
        return None
    return attempt, code
