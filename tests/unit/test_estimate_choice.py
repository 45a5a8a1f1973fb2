"""Which option ``kiln estimate`` recommends once the queue is counted (``core.services.estimate_queue.choose``):
options are projected cheapest first until one meets the deadline, at most ``MAX_PROJECTED``; the best verdict
wins, the cheapest among equals, and the cheaper ones passed over are named."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from core.estimate import SINGLE, Config, Option, Shape, StepTime, cost
from core.services.estimate_queue import MAX_PROJECTED, QueueVerdict, choose
from core.services.why import StartForecast

NOW = datetime(2026, 12, 7, tzinfo=UTC)
SMALL = Shape("gpt", "small b8", 1e12, "gpt small b8")


def _option(gpu_hours: float, device: str = "H200") -> Option:
    step = StepTime(gpu_hours * 36, gpu_hours * 36, gpu_hours * 36, "measured", "", 1, 1, None)
    o = Option(Config(device, 1, SINGLE, True, "bf16"), SMALL, step=step, price=1.0)
    return replace(cost(o, steps=100, now=NOW, deadline=None), meets_deadline=True)


class Queue:
    """Each option's verdict as the scheduler's projection would give it; which were projected, in order."""

    def __init__(self, verdicts: dict[int, str]) -> None:
        self.verdicts, self.projected = verdicts, list[int]()

    def __call__(self, i: int) -> QueueVerdict:
        self.projected.append(i)
        start = StartForecast(NOW, NOW, ("h",), "projected")
        return QueueVerdict(i, start, NOW, self.verdicts[i], f"option {i}: {self.verdicts[i]}.")


def test_the_cheapest_that_meets_it_is_projected_alone() -> None:
    queue = Queue({0: "misses", 1: "meets", 2: "meets"})
    best, q = choose([_option(3.0), _option(1.0), _option(2.0)], queue)
    assert (best, q.verdict, q.passed_over, queue.projected) == (1, "meets", (), [1])
    assert q.sentence == "option 1: meets."


def test_cheaper_options_that_wait_too_long_are_passed_over_and_named() -> None:
    queue = Queue({0: "meets", 1: "misses", 2: "may miss"})
    best, q = choose([_option(3.0, "A100-80GB"), _option(1.0, "H100-80GB"), _option(2.0)], queue)
    assert (best, q.verdict, q.passed_over, queue.projected) == (0, "meets", (1, 2), [1, 2, 0])
    assert q.sentence.endswith(
        "Cheaper by the run alone but later in the queue: 1 x H100-80GB, compiled, bf16 (misses); "
        "1 x H200, compiled, bf16 (may miss)."
    )


def test_when_none_meets_it_the_best_verdict_wins_and_the_projections_are_bounded() -> None:
    options = [_option(float(n)) for n in range(10, 0, -1)]  # the last is the cheapest
    queue = Queue(dict.fromkeys(range(10), "misses") | {7: "may miss"})
    best, q = choose(options, queue)
    assert len(queue.projected) == MAX_PROJECTED and queue.projected[0] == 9
    assert (best, q.verdict, q.passed_over) == (7, "may miss", (9, 8))


def test_an_unknown_start_of_the_cheapest_is_kept_and_a_later_unknown_is_worse_than_a_miss() -> None:
    queue = Queue({0: "meets", 1: "unknown"})
    best, q = choose([_option(2.0), _option(1.0)], queue)
    assert (best, q.verdict, queue.projected) == (1, "unknown", [1])
    queue = Queue({0: "unknown", 1: "misses"})
    best, q = choose([_option(2.0), _option(1.0)], queue)
    assert (best, q.verdict, queue.projected) == (1, "misses", [1, 0])


def test_with_no_qualifying_option_the_job_as_written_is_projected_and_none_recommended() -> None:
    queue = Queue({0: "misses"})
    best, q = choose([replace(_option(1.0), meets_deadline=False)], queue)
    assert (best, q.verdict, queue.projected) == (None, "misses", [0])
