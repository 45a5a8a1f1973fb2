"""The lifecycle tables of ``core.states`` and ``core.lifecycle``, case by case: which job, attempt and host changes
are allowed, what each exit class does to the attempt and the job, and the restart backoff."""

from __future__ import annotations

import pytest

from core.lifecycle import EXIT_CLASS_ENDS, ExitClass, Requeue, restart_backoff_s
from core.models import Attempt, Host
from core.settings import Timings
from core.states import (
    ACTIVE,
    ATTEMPT_LIVE,
    ATTEMPT_TRANSITIONS,
    HOST_TRANSITIONS,
    TERMINAL,
    TRANSITIONS,
    AttemptState,
    HostState,
    JobState,
    Reason,
    can_transition,
)
from core.transitions import IllegalTransition, move_attempt, move_host

J, A, H = JobState, AttemptState, HostState

JOB_CASES: dict[str, tuple[JobState, JobState, bool]] = {
    "admitted": (J.QUEUED, J.ADMITTED, True),
    "cancelled while queued": (J.QUEUED, J.CANCELLED, True),
    "failed by the policy (unsatisfiable)": (J.QUEUED, J.FAILED, True),
    "queued cannot run without an admission": (J.QUEUED, J.RUNNING, False),
    "queued cannot be lost (nothing runs)": (J.QUEUED, J.LOST, False),
    "started": (J.ADMITTED, J.RUNNING, True),
    "never started, requeued": (J.ADMITTED, J.QUEUED, True),
    "lost before it started": (J.ADMITTED, J.LOST, True),
    "admitted cannot be preempted before it runs": (J.ADMITTED, J.PREEMPTING, False),
    "finished": (J.RUNNING, J.SUCCEEDED, True),
    "preemption asked": (J.RUNNING, J.PREEMPTING, True),
    "preempted or drained back to the queue": (J.RUNNING, J.QUEUED, True),
    "lost while running": (J.RUNNING, J.LOST, True),
    "running cannot be admitted again": (J.RUNNING, J.ADMITTED, False),
    "checkpointed and requeued": (J.PREEMPTING, J.QUEUED, True),
    "finished before the preemption took effect": (J.PREEMPTING, J.SUCCEEDED, True),
    "preempting cannot go back to running": (J.PREEMPTING, J.RUNNING, False),
    "resumed": (J.PAUSED, J.RUNNING, True),
    "lost, restarted": (J.LOST, J.QUEUED, True),
    "lost, past max_restarts": (J.LOST, J.FAILED, True),
    "lost cannot run again without the queue": (J.LOST, J.RUNNING, False),
    "succeeded is final": (J.SUCCEEDED, J.QUEUED, False),
    "failed is final": (J.FAILED, J.QUEUED, False),
    "cancelled is final": (J.CANCELLED, J.RUNNING, False),
}


@pytest.mark.parametrize(("current", "target", "allowed"), JOB_CASES.values(), ids=JOB_CASES.keys())
def test_job_transitions(current: JobState, target: JobState, allowed: bool) -> None:
    assert can_transition(current, target) is allowed


def test_job_state_sets() -> None:
    assert {J.SUCCEEDED, J.FAILED, J.CANCELLED} == TERMINAL
    assert not ACTIVE & TERMINAL and J.QUEUED not in ACTIVE and J.LOST not in ACTIVE
    assert set(TRANSITIONS) == set(JobState)


ATTEMPT_CASES: dict[str, tuple[AttemptState, AttemptState, bool]] = {
    "claimed by a worker": (A.PENDING, A.RUNNING, True),
    "cancelled before it started": (A.PENDING, A.CANCELLED, True),
    "never picked up, host gone": (A.PENDING, A.LOST, True),
    "never started, the job moved on": (A.PENDING, A.SUPERSEDED, True),
    "pending cannot succeed without running": (A.PENDING, A.SUCCEEDED, False),
    "pending cannot be preempted": (A.PENDING, A.PREEMPTED, False),
    "succeeded": (A.RUNNING, A.SUCCEEDED, True),
    "user error, OOM or time limit": (A.RUNNING, A.FAILED, True),
    "cancelled": (A.RUNNING, A.CANCELLED, True),
    "preempted": (A.RUNNING, A.PREEMPTED, True),
    "drained": (A.RUNNING, A.DRAINED, True),
    "lease expired": (A.RUNNING, A.LOST, True),
    "a newer attempt owns the job": (A.RUNNING, A.FENCED, True),
    "silent after the job moved on": (A.RUNNING, A.SUPERSEDED, True),
    "running cannot go back to pending": (A.RUNNING, A.PENDING, False),
    "lost is final": (A.LOST, A.RUNNING, False),
    "an ended attempt is never ended again": (A.SUCCEEDED, A.LOST, False),
    "superseded is final": (A.SUPERSEDED, A.FENCED, False),
}


@pytest.mark.parametrize(("current", "target", "allowed"), ATTEMPT_CASES.values(), ids=ATTEMPT_CASES.keys())
def test_attempt_transitions(current: AttemptState, target: AttemptState, allowed: bool) -> None:
    attempt = Attempt(id=1, state=current.value)
    if allowed:
        move_attempt(attempt, target)
        assert attempt.state == target.value
    else:
        with pytest.raises(IllegalTransition, match=f"attempt 1: {current} -> {target}"):
            move_attempt(attempt, target)
        assert attempt.state == current.value


def test_only_pending_and_running_attempts_are_live() -> None:
    assert {A.PENDING, A.RUNNING} == ATTEMPT_LIVE
    assert set(ATTEMPT_TRANSITIONS) == set(AttemptState)


HOST_CASES: dict[str, tuple[HostState, HostState, bool]] = {
    "heartbeat stale": (H.UP, H.DOWN, True),
    "a GPU raised an Xid/ECC error": (H.UP, H.EXCLUDED, True),
    "registered again while up": (H.UP, H.UP, True),
    "heartbeating again": (H.DOWN, H.UP, True),
    "heartbeating again while still excluded": (H.DOWN, H.EXCLUDED, True),
    "exclusion served": (H.EXCLUDED, H.UP, True),
    "excluded and then silent": (H.EXCLUDED, H.DOWN, True),
    "its consumer went silent": (H.UP, H.UNREACHABLE, True),
    "consuming again": (H.UNREACHABLE, H.UP, True),
    "unreachable and then silent": (H.UNREACHABLE, H.DOWN, True),
    "a GPU error while unreachable": (H.UNREACHABLE, H.EXCLUDED, True),
    "heartbeating again before its consumer is seen": (H.DOWN, H.UNREACHABLE, True),
}


@pytest.mark.parametrize(("current", "target", "allowed"), HOST_CASES.values(), ids=HOST_CASES.keys())
def test_host_transitions(current: HostState, target: HostState, allowed: bool) -> None:
    host = Host(name="h1", state=current.value)
    move_host(host, target)
    assert host.state == target.value and (target is current or target in HOST_TRANSITIONS[current])


def test_every_host_change_is_in_the_table() -> None:
    assert set(HOST_TRANSITIONS) == set(HostState)
    for current, targets in HOST_TRANSITIONS.items():
        assert current not in targets


EXIT_CASES: dict[ExitClass, tuple[AttemptState, JobState, Requeue, Reason | None]] = {
    ExitClass.SUCCEEDED: (A.SUCCEEDED, J.SUCCEEDED, Requeue.NO, None),
    ExitClass.CANCELLED: (A.CANCELLED, J.CANCELLED, Requeue.NO, None),
    ExitClass.PREEMPTED: (A.PREEMPTED, J.QUEUED, Requeue.KEEP_PROGRESS, Reason.PREEMPTED),
    ExitClass.DRAINED: (A.DRAINED, J.QUEUED, Requeue.KEEP_PROGRESS, Reason.DRAINED),
    ExitClass.USER_ERROR: (A.FAILED, J.FAILED, Requeue.NO, None),
    ExitClass.OOM: (A.FAILED, J.FAILED, Requeue.NO, None),
    ExitClass.TIMEOUT: (A.FAILED, J.FAILED, Requeue.NO, None),
    ExitClass.INFRASTRUCTURE: (A.LOST, J.LOST, Requeue.RESTART, None),
    ExitClass.NCCL_ERROR: (A.LOST, J.LOST, Requeue.RESTART, None),
    ExitClass.FENCED: (A.LOST, J.LOST, Requeue.RESTART, None),
}


@pytest.mark.parametrize(("exit_class", "expected"), EXIT_CASES.items(), ids=[c.value for c in EXIT_CASES])
def test_exit_class_ends(
    exit_class: ExitClass, expected: tuple[AttemptState, JobState, Requeue, Reason | None]
) -> None:
    end = EXIT_CLASS_ENDS[exit_class]
    assert (end.attempt, end.job, end.requeue, end.pending_reason) == expected
    # Consistent with the state machines: a running attempt of a running (or preempting) job may end this way.
    assert end.attempt in ATTEMPT_TRANSITIONS[A.RUNNING]
    assert end.job in TRANSITIONS[J.RUNNING] and end.job in TRANSITIONS[J.PREEMPTING]


def test_every_exit_class_has_an_end() -> None:
    assert set(EXIT_CLASS_ENDS) == set(ExitClass) == set(EXIT_CASES)


def test_a_restart_goes_lost_then_queued_or_failed() -> None:
    assert can_transition(J.LOST, J.QUEUED) and can_transition(J.LOST, J.FAILED)


@pytest.mark.parametrize(
    ("restart", "backoff_s"), [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 256.0), (10, 300.0)]
)
def test_restart_backoff_doubles_up_to_its_cap(restart: int, backoff_s: float) -> None:
    assert restart_backoff_s(restart, Timings()) == backoff_s


def test_the_operator_sets_the_backoff() -> None:
    timings = Timings(restart_backoff_base_s=2.0, restart_backoff_cap_s=5.0)
    assert [restart_backoff_s(n, timings) for n in (1, 2, 3)] == [2.0, 4.0, 5.0]


def test_reasons_are_one_vocabulary() -> None:
    values = [r.value for r in Reason]
    assert len(values) == len(set(values))
    # What the jobs table already holds keeps its meaning: the words are the ones written before the enum.
    assert {
        "Quota",
        "Budget",
        "Resources",
        "Priority",
        "Dependency",
        "BandwidthQuota",
        "MemoryFit",
        "Reservation",
        "Backoff",
        "Preempted",
        "Drained",
        "Unschedulable",
        "SweepLimit",
        "Held",
    } == set(values)
