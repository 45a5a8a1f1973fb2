"""The final checkpoint gates a job's success: it is retried until it is durable or the retry window ends.

An intermediate save that fails is an event and training goes on (the next one will do). The final one is
different: a job is recorded SUCCEEDED with its final step and loss, and a restart or an export reads them from
that checkpoint. A chaos run with the storage read-only for 20 s ended two jobs SUCCEEDED at step 400 while
their newest weights were step 360's. So the final save is retried with exponential backoff for
``KILN_FINAL_CHECKPOINT_RETRY_S`` (storage that is remounted, a full disk that a retention pass frees, an NFS
server back); still failing, the rank raises ``StorageUnwritable`` and exits ``ExitCode.STORAGE_ERROR``, which
the worker classifies as an infrastructure failure: the job restarts from its last verified checkpoint.

Standard library only: the script client (``trainer.script_client``) retries its commits with the same loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol

from core.trainer_protocol import DEFAULT_FINAL_CHECKPOINT_RETRY_S, ENV_FINAL_CHECKPOINT_RETRY_S

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 15.0  # a long window is tried every 15 s at worst: storage back is found within that


class StorageUnwritable(Exception):
    """The final checkpoint could not be made durable within the retry window (-> ExitCode.STORAGE_ERROR)."""


class Events(Protocol):
    def event(self, type_: str, message: str, **fields: object) -> None: ...


def retry_window_s() -> float:
    """The worker's ``final_checkpoint_retry_s``, handed to the ranks in their environment."""
    try:
        return max(0.0, float(os.environ[ENV_FINAL_CHECKPOINT_RETRY_S]))
    except (KeyError, ValueError):
        return DEFAULT_FINAL_CHECKPOINT_RETRY_S


def _solo(failed: bool, give_up: bool) -> tuple[bool, bool]:
    return failed, give_up


def save_durably(
    save: Callable[[], BaseException | None],
    *,
    step: int,
    tel: Events | None,
    window_s: float | None = None,
    agree: Callable[[bool, bool], tuple[bool, bool]] = _solo,
    sleep: Callable[[float], None] = time.sleep,
    what: str = "final checkpoint",
) -> int:
    """Call ``save`` (it returns what failed, or None once the checkpoint is committed) until it succeeds; returns
    the number of tries. ``agree``: every rank's (failed, give up) combined (any rank's counts), so that all ranks
    retry the collective save together or give up together. Raises ``StorageUnwritable`` naming the last error."""
    window = retry_window_s() if window_s is None else window_s
    deadline = time.monotonic() + window
    delay, tries, err = FIRST_DELAY_S, 0, None
    while True:
        tries += 1
        err = save()
        failed, give_up = agree(err is not None, time.monotonic() + delay > deadline)
        if not failed:
            if tries > 1 and tel is not None:
                tel.event(
                    "CHECKPOINT_RETRY_SAVED", f"{what} of step {step} committed at try {tries}", step=step, tries=tries
                )
            return tries
        said = repr(err) if err is not None else "another rank's write failed"
        if give_up:
            raise StorageUnwritable(
                f"checkpoint storage unwritable: the {what} of step {step} could not be committed "
                f"in {tries} tries over {window:g} s (KILN_FINAL_CHECKPOINT_RETRY_S): {said}"
            )
        if tel is not None:
            tel.event(
                "CHECKPOINT_RETRY",
                f"{what} of step {step} failed ({said}); retrying in {delay:g} s",
                step=step,
                tries=tries,
                error=said,
                delay_s=delay,
            )
        sleep(delay)
        delay = min(MAX_DELAY_S, delay * 2)
