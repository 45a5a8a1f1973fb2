"""Classify how an attempt ended, from the trainer's exit codes and what the supervisor itself did.

The classes decide the attempt's end and the job's next state (``core.lifecycle.EXIT_CLASS_ENDS``): only
infrastructure failures are retried automatically; a user error or an OOM would fail again the same way. Who caused
a crash is the trainer's to say (``trainer.user_error``): a mistake in the user's settings or recipe exits
USER_ERROR with the user's own exception line, which becomes the job's reason; a crash it did not classify (a
signal, an OOM kill, a host or link failure) is infrastructure.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from core.lifecycle import ExitClass
from core.trainer_protocol import ExitCode


@dataclass(frozen=True)
class StopRequest:
    """Why the supervisor sent SIGTERM (None: it did not): the class, and in words (the job's reason says it)."""

    reason: ExitClass
    why: str = ""


@dataclass(frozen=True)
class Outcome:
    exit_class: ExitClass
    reason: str


def _describe(code: int, *, asked: bool = False) -> str:
    """A rank's or the launcher's exit code in words; ``asked``: the supervisor had told it to stop, so the
    trainer's code for a stop on SIGTERM (75) is what was asked for, whatever the reason."""
    if asked and code == ExitCode.PREEMPTED:
        return f"exit code {code}, stopped after its checkpoint"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    try:
        return f"exit code {code} ({ExitCode(code).name})"
    except ValueError:
        return f"exit code {code}"


def classify(
    rank_codes: dict[int, int],
    launcher_code: int,
    stop: StopRequest | None,
    rank_errors: dict[int, str] | None = None,
    *,
    ranks: range | None = None,
    backend: str = "NCCL",
) -> Outcome:
    """``rank_codes``: the exit code each rank recorded (a rank killed by a signal records none).

    ``launcher_code`` is torchrun's own code, which only says "some rank failed"; the ranks' codes say how.
    ``rank_errors``: the exception line a rank gave in its last telemetry record, when it had one. ``ranks``: the
    ranks this node ran, when known (one node: all of them), so that a rank that died without a code is named;
    ``backend``: the collectives' library, as the user knows it (NCCL on GPUs, gloo on CPUs).
    """
    codes = set(rank_codes.values())
    worst = next((c for c in rank_codes.values() if c != 0), launcher_code)
    asked = stop is not None
    detail = ", ".join(f"rank {r}: {_describe(c, asked=asked)}" for r, c in sorted(rank_codes.items())) or _describe(
        launcher_code, asked=asked
    )

    if ExitCode.FENCED in codes:
        return Outcome(ExitClass.FENCED, f"fenced: a newer attempt owns the job ({detail})")
    if stop is not None:
        # We asked it to stop. A clean PREEMPTED exit means a checkpoint was committed first; a rank that
        # had to be killed after the grace period still stops for the same reason (its progress is the last
        # checkpoint).
        if launcher_code == 0 and codes <= {ExitCode.SUCCEEDED} and rank_codes:
            return Outcome(ExitClass.SUCCEEDED, f"finished before the stop took effect ({detail})")
        said = f"{stop.reason.value}: {stop.why}" if stop.why else stop.reason.value
        return Outcome(stop.reason, f"{said} ({detail})")
    if launcher_code == 0 and (not rank_codes or codes == {ExitCode.SUCCEEDED}):
        return Outcome(ExitClass.SUCCEEDED, "succeeded")
    if ExitCode.OOM in codes:
        return Outcome(ExitClass.OOM, f"out of memory ({detail})")

    def first_line(code: ExitCode) -> str | None:
        """The exception line of the lowest rank that exited with ``code`` and gave one."""
        lines = ((rank_errors or {}).get(r) for r, c in sorted(rank_codes.items()) if c == code)
        return next((x for x in lines if x), None)

    if ExitCode.USER_ERROR in codes:
        line = first_line(ExitCode.USER_ERROR)
        return Outcome(ExitClass.USER_ERROR, f"user error: {line}" if line else f"user error ({detail})")
    if ExitCode.TOO_MANY_SPIKES in codes:  # the trainer's line says how it diverged (spikes, non-finite steps)
        return Outcome(ExitClass.USER_ERROR, first_line(ExitCode.TOO_MANY_SPIKES) or f"training diverged ({detail})")
    if ExitCode.STORAGE_ERROR in codes:  # the line names the storage's error (the OSError the final save met)
        line = first_line(ExitCode.STORAGE_ERROR)
        return Outcome(ExitClass.INFRASTRUCTURE, line or f"checkpoint storage unwritable ({detail})")
    if ExitCode.NCCL_ERROR in codes:
        dead = [r for r in ranks or () if r not in rank_codes]
        if dead:  # the peer that died first is the cause; the others only saw their collective fail
            said = ", ".join(f"rank {r}" for r in dead)
            return Outcome(
                ExitClass.NCCL_ERROR,
                f"{backend} error: {said} died without an exit code (killed by a signal) and the others' "
                f"collectives failed ({detail})",
            )
        return Outcome(ExitClass.NCCL_ERROR, f"{backend} error ({detail})")
    if ExitCode.LEASE_EXPIRED in codes:
        return Outcome(ExitClass.INFRASTRUCTURE, f"lease expired: the worker could not renew it in time ({detail})")
    if ExitCode.PREEMPTED in codes:
        # SIGTERM that did not come from us (the host is shutting down): progress is checkpointed.
        return Outcome(ExitClass.DRAINED, f"stopped by an outside SIGTERM ({detail})")
    return Outcome(ExitClass.INFRASTRUCTURE, f"crashed: {_describe(worst)} ({detail})")
