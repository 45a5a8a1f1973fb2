"""How an attempt's end is classified: who caused it decides whether the job restarts (table-driven)."""

from __future__ import annotations

import pytest

from core.lifecycle import ExitClass
from core.trainer_protocol import ExitCode
from workers.exit_classes import StopRequest, classify

HUNG = "no training progress for 900 s: hung"
DATA_LINE = "building the data: ValueError: corpus shorter than one sequence"
STORAGE_LINE = (
    "checkpoint storage unwritable: the final checkpoint of step 400 could not be committed in 6 tries over 20 s "
    "(KILN_FINAL_CHECKPOINT_RETRY_S): OSError(30, 'Read-only file system')"
)
DIVERGED_LINE = "training diverged: the loss or grad norm was non-finite for 20 steps in a row (steps 6-25)"

CASES: dict[str, tuple[dict[int, int], int, StopRequest | None, dict[int, str], ExitClass, str]] = {
    # name: (rank codes, torchrun's code, stop the worker asked for, ranks' error lines, class, reason starts with)
    "done": ({0: 0, 1: 0}, 0, None, {}, ExitClass.SUCCEEDED, "succeeded"),
    "user mistake, with its own line": (
        {0: 2, 1: 2},
        1,
        None,
        {0: DATA_LINE, 1: DATA_LINE},
        ExitClass.USER_ERROR,
        f"user error: {DATA_LINE}",
    ),
    "user mistake on one rank": (
        {0: 0, 1: 2},
        1,
        None,
        {1: DATA_LINE},
        ExitClass.USER_ERROR,
        f"user error: {DATA_LINE}",
    ),
    "user mistake, no line": ({0: 2}, 1, None, {}, ExitClass.USER_ERROR, "user error (rank 0: exit code 2"),
    "spike guard gave up, no line": ({0: 77}, 1, None, {}, ExitClass.USER_ERROR, "training diverged (rank 0: exit"),
    "non-finite steps, with the trainer's line": (
        {0: 77, 1: 77},
        1,
        None,
        {0: DIVERGED_LINE, 1: DIVERGED_LINE},
        ExitClass.USER_ERROR,
        DIVERGED_LINE,
    ),
    "crash the trainer did not blame on the user": (
        {0: 1},
        1,
        None,
        {0: "RuntimeError: boom"},
        ExitClass.INFRASTRUCTURE,
        "crashed: exit code 1",
    ),
    "killed (OOM killer, host loss)": ({}, -9, None, {}, ExitClass.INFRASTRUCTURE, "crashed: killed by SIGKILL"),
    "collective failed": ({0: 79, 1: 1}, 1, None, {}, ExitClass.NCCL_ERROR, "NCCL error"),
    "out of memory": ({0: 78}, 1, None, {}, ExitClass.OOM, "out of memory"),
    "lease not renewed": ({0: 80}, 1, None, {}, ExitClass.INFRASTRUCTURE, "lease expired"),
    # The final checkpoint could not be made durable: the storage's fault, restarted; the reason names its error.
    "storage unwritable, with the trainer's line": (
        {0: 81, 1: 81},
        1,
        None,
        {0: STORAGE_LINE, 1: "checkpoint storage unwritable: ... another rank's write failed"},
        ExitClass.INFRASTRUCTURE,
        STORAGE_LINE,
    ),
    "storage unwritable, no line": ({0: 81}, 1, None, {}, ExitClass.INFRASTRUCTURE, "checkpoint storage unwritable"),
    "fenced": ({0: 76}, 1, None, {}, ExitClass.FENCED, "fenced"),
    "outside SIGTERM": ({0: 75}, 1, None, {}, ExitClass.DRAINED, "stopped by an outside SIGTERM"),
    "preempted by us": ({0: 75}, 1, StopRequest(ExitClass.PREEMPTED), {}, ExitClass.PREEMPTED, "preempted"),
    "fenced stop by us": ({0: 80}, 1, StopRequest(ExitClass.FENCED), {}, ExitClass.FENCED, "fenced"),
    "hung, stopped by us, says why": (
        {},
        -9,
        StopRequest(ExitClass.INFRASTRUCTURE, HUNG),
        {},
        ExitClass.INFRASTRUCTURE,
        f"infrastructure: {HUNG} (killed by SIGKILL)",
    ),
    "time limit, says why": (
        {0: 75},
        1,
        StopRequest(ExitClass.TIMEOUT, "time limit reached"),
        {},
        ExitClass.TIMEOUT,
        "timeout: time limit reached (rank 0: exit code 75, stopped after its checkpoint)",
    ),
    "finished before our stop": (
        {0: 0},
        0,
        StopRequest(ExitClass.CANCELLED),
        {},
        ExitClass.SUCCEEDED,
        "finished before the stop",
    ),
}


def test_a_rank_that_died_is_named_as_the_cause_of_its_peers_collective_errors() -> None:
    """A two-rank CPU job whose rank 1 was killed read "NCCL error (rank 0: exit code 79)": neither the rank that
    died nor the library (gloo) was named."""
    outcome = classify({0: 79}, 1, None, ranks=range(2), backend="gloo")
    assert outcome.exit_class is ExitClass.NCCL_ERROR
    assert outcome.reason.startswith("gloo error: rank 1 died without an exit code (killed by a signal)"), outcome
    assert "rank 0: exit code 79" in outcome.reason
    gang = classify({0: 79}, 1, None, ranks=None, backend="NCCL")  # a gang's node: its ranks' numbers are not known
    assert gang.reason.startswith("NCCL error (rank 0: exit code 79"), gang


@pytest.mark.parametrize("name", CASES)
def test_classify(name: str) -> None:
    codes, launcher, stop, errors, cls, reason = CASES[name]
    outcome = classify(codes, launcher, stop, errors)
    assert outcome.exit_class is cls, outcome
    assert outcome.reason.startswith(reason), outcome.reason


def test_every_trainer_exit_code_is_classified_on_purpose() -> None:
    seen = {code for codes, *_ in CASES.values() for code in codes.values()}
    assert set(ExitCode) <= seen
