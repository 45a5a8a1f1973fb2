"""Whether an estimate's choice meets the spec's deadline once its time in the queue is counted (``kiln estimate``).

The run time alone (``core.estimate.cost``) says nothing of the wait: a job that trains in an hour misses a deadline
two hours away behind a queue of three. The expected start is the one ``kiln why`` shows for a queued job: the
scheduler's ``plan()`` run forward from the live snapshot (``scheduler.live.forecast``), here with the job as it
would be submitted added to the queue, handed in by the API's composition root as ``would_start`` (``core`` imports
no scheduler). The verdict puts the run after that start: ``meets`` when it ends before the deadline even from the
latest start, ``misses`` when it ends after it even from the earliest, ``may miss`` between, ``unknown`` when no
start (or no run time) can be said.

The queue also decides the choice (``choose``): the cheapest option by its run alone may wait behind running jobs
for its GPU type while a dearer one starts now. Options are projected cheapest first until one meets the deadline,
at most ``MAX_PROJECTED`` of them (each projection is one pass of the scheduler's ``plan()``); the one with the best
verdict is recommended, the cheapest among equals, and the cheaper ones passed over are named with theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from core import estimate as est
from core.services.why import StartForecast
from core.spec import JobSpec


@dataclass(frozen=True)
class WouldBe:
    """A job not submitted yet, as the scheduler's projection needs it."""

    spec: JobSpec  # the option's: the job as written with the option's changes
    team_id: int
    qos_class_id: int | None  # the class the submission would get
    priority: int
    memory_bytes: int | None  # predicted peak per GPU


# (session, now) -> each would-be job's expected start over one read of the queue:
# scheduler.live.forecast.would_be_projector, policy bound
WouldStart = Callable[[Session, datetime], Callable[[WouldBe], StartForecast]]
MAX_PROJECTED = 4  # options projected through the queue for one estimate, cheapest first
# Which verdict is better to recommend: an unknown start is worse than a known miss, since nothing can be said of it
# (the first option's unknown is kept as it is: the others' starts are no better known).
RANK = {"meets": 0, "may miss": 1, "misses": 2, "unknown": 3}


@dataclass(frozen=True)
class QueueVerdict:
    option: int  # index into the estimate's options: the recommended one, else the job as written
    start: StartForecast
    latest_end: datetime | None  # the latest start plus the run; None: not known
    verdict: str  # meets | may miss | misses | unknown
    sentence: str
    passed_over: tuple[int, ...] = ()  # cheaper options (by their run alone) whose verdict was worse


def with_changes(spec: JobSpec, changes: dict[str, object]) -> JobSpec:
    """``spec`` with an option's changes (dotted paths; None removes the field), validated as a submission is."""
    data: dict[str, Any] = spec.model_dump(mode="json", exclude_none=True)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for name in parents:
            node = node.setdefault(name, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return JobSpec.model_validate(data)


def verdict(option: int, chosen: est.Option, start: StartForecast, deadline: datetime) -> QueueVerdict:
    """Whether ``chosen``, started as ``start`` says, ends before ``deadline``; in one sentence."""
    which = "the recommended option" if option else "the job as written"
    if start.earliest is None or start.latest is None:
        said = start.basis.removeprefix("cannot be known: ")
        return QueueVerdict(
            option, start, None, "unknown", f"Counting the queue: when {which} would start cannot be known: {said}."
        )
    same = start.earliest == start.latest
    when = f"at {_at(start.earliest)}" if same else f"between {_at(start.earliest)} and {_at(start.latest)}"
    if chosen.hours is None:
        return QueueVerdict(
            option,
            start,
            None,
            "unknown",
            f"Counting the queue: {which} would start {when}; with no step time, whether it ends before the deadline "
            "cannot be said.",
        )
    run = timedelta(hours=chosen.hours)
    latest_end, earliest_end = start.latest + run, start.earliest + run
    if latest_end <= deadline:
        said, how = "meets", f"ends by {_at(latest_end)} at the latest"
    elif earliest_end > deadline:
        said, how = "misses", f"ends at {_at(earliest_end)} at the earliest"
    else:
        said, how = "may miss", f"ends between {_at(earliest_end)} and {_at(latest_end)}"
    sentence = (
        f"Counting the queue: {which} would start {when} (the scheduler's projection) and {how}: it {said} the "
        f"deadline ({_at(deadline)})."
    )
    return QueueVerdict(option, start, latest_end, said, sentence)


def choose(options: Sequence[est.Option], project: Callable[[int], QueueVerdict]) -> tuple[int | None, QueueVerdict]:
    """The recommended option counting the queue, and its verdict. ``project(i)``: option ``i``'s verdict. Without
    a qualifying option (``est.cheapest``), the job as written is projected and none is recommended."""
    left = list(options)
    pick = est.cheapest(left, written=0)
    if pick is None:
        return None, project(0)
    tried: list[QueueVerdict] = []
    while pick is not None and len(tried) < MAX_PROJECTED:
        tried.append(project(pick))
        if tried[-1].verdict == "meets" or (tried[-1].verdict == "unknown" and len(tried) == 1):
            break
        left[pick] = replace(left[pick], meets_deadline=False)  # for this choice only: it misses counting the queue
        pick = est.cheapest(left, written=0)
    at = min(range(len(tried)), key=lambda i: (RANK[tried[i].verdict], i))
    chosen = tried[at]
    if at == 0:
        return chosen.option, chosen
    passed = tried[:at]
    names = "; ".join(f"{est.describe(options[v.option].config)} ({v.verdict})" for v in passed)
    sentence = f"{chosen.sentence} Cheaper by the run alone but later in the queue: {names}."
    return chosen.option, replace(chosen, sentence=sentence, passed_over=tuple(v.option for v in passed))


def _at(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%SZ")
