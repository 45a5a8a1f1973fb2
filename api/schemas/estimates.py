"""What ``POST /v1/estimates`` answers: the job's options before it runs (``core.services.estimates``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from api.schemas.common import OutModel, UTCDatetime
from core import estimate as est
from core.services.estimate_queue import QueueVerdict
from core.services.estimates import Estimate


class StepTimeOut(OutModel):
    median_s: float = Field(description="Median seconds a step, steady state.")
    low_s: float = Field(description="10th percentile of the steps it is read from.")
    high_s: float = Field(description="90th percentile.")
    basis: Literal["measured", "scaled", "cross-type"] = Field(
        description="measured: runs of this shape in this configuration; scaled: another shape's on this GPU type, "
        "by FLOPs per rank; cross-type: runs on another GPU type, by the two types' published peak throughput and "
        "memory bandwidth (see scaled_from)."
    )
    scaled_from: str | None = Field(
        description="cross-type: the GPU type the runs were measured on; null otherwise.", examples=["H200"]
    )
    label: str = Field(
        description="The basis as the CLI and the dashboard say it: measured, scaled, or 'scaled from <type>'.",
        examples=["scaled from H200"],
    )
    detail: str = Field(examples=["3 run(s) of this shape on 1 x H200, compiled, bf16"])
    samples: int = Field(description="Steps it is read from.")
    runs: int = Field(description="Attempts it is read from.")
    startup_s: float | None = Field(description="Launch to first step (compile included), median; null: unknown.")


class OptionOut(OutModel):
    gpu_type: str = Field(description="A GPU type, or 'cpu'.", examples=["H200"])
    gpus: int = Field(description="GPUs, or CPU slots for 'cpu'.")
    parallelism: Literal["single", "ddp", "fsdp"] = Field(description="single: one process, no wrapper.")
    compiled: bool
    precision: str
    gpu_share: bool = Field(description="A fraction of one GPU through MPS.")
    description: str = Field(examples=["2 x H200, ddp, compiled, bf16"])
    changes: dict[str, Any] = Field(
        description="Spec fields to change from the job as written, by dotted path (null: remove the field).",
        examples=[{"resources.gpus": 2, "recipe.hyperparameters.batch_size": 16}],
    )
    peak_memory_bytes: int | None = Field(description="Per GPU; null: not known (CPU, or code kiln cannot predict).")
    memory_basis: Literal["predicted", "measured"] | None
    gpu_memory_bytes: int | None = Field(description="What one GPU (or the share) gives the job, QoS cap included.")
    fits: bool | None = Field(description="Peak within the GPU's memory; null: not known.")
    step_time: StepTimeOut | None = Field(description="null: no measured history to go by.")
    price_per_gpu_hour: float
    hours: float | None = Field(description="Wall hours of the run: start-up + steps x median step time.")
    gpu_hours: float | None
    gpu_hours_low: float | None = Field(description="At the 10th percentile step time.")
    gpu_hours_high: float | None = Field(description="At the 90th percentile step time.")
    cost: float | None
    meets_deadline: bool | None = Field(description="null: the spec has no deadline, or no step time is known.")


class QueueOut(OutModel):
    option: int = Field(description="Index into options: the recommended one, else the job as written.")
    expected_start_earliest: UTCDatetime | None = Field(description="The scheduler's projection; null: not known.")
    expected_start_latest: UTCDatetime | None
    expected_start_basis: str = Field(description="How the start is known, or why it cannot be.")
    hosts: list[str] = Field(description="Where it would start (the earliest scenario's placement).")
    latest_end: UTCDatetime | None = Field(description="The latest start plus the run; null: not known.")
    verdict: Literal["meets", "may miss", "misses", "unknown"] = Field(
        description="meets: it ends before the deadline even from the latest start; misses: after it even from the "
        "earliest; may miss: between; unknown: no start or no run time to go by."
    )
    passed_over: list[int] = Field(
        description="Indexes of cheaper options (by their run alone) passed over: counting the queue, their verdict "
        "was worse than the recommended one's."
    )
    sentence: str = Field(
        examples=[
            "Counting the queue: the job as written would start at 2026-12-07 04:00:00Z (the scheduler's "
            "projection) and ends by 2026-12-07 04:05:10Z at the latest: it meets the deadline (2026-12-07 05:00:00Z)."
        ]
    )


class EstimateOut(OutModel):
    name: str
    recipe: str
    steps: int
    shape: str = Field(description="The work of a step as kiln keys its history.")
    deadline: UTCDatetime | None
    currency: str
    options: list[OptionOut] = Field(description="The job as written first, then the others by cost.")
    recommended: int | None = Field(
        description="Index into options: the cheapest that fits and meets the deadline (with a deadline, counting "
        "the queue: see queue.passed_over)."
    )
    measured_runs: int = Field(description="Measured attempts of this recipe kiln read.")
    summary: str
    notes: list[str]
    queue: QueueOut | None = Field(
        description="Where the spec has a deadline: whether the chosen option meets it once its expected start (the "
        "scheduler's projection, as kiln why's) is counted; null without a deadline."
    )


def option_out(o: est.Option) -> OptionOut:
    c, s = o.config, o.step
    step = None
    if s is not None:
        step = StepTimeOut(
            median_s=s.median_s,
            low_s=s.low_s,
            high_s=s.high_s,
            basis=s.basis,  # type: ignore[arg-type]
            detail=s.detail,
            samples=s.samples,
            runs=s.runs,
            startup_s=s.startup_s,
            scaled_from=s.scaled_from,
            label=s.label,
        )
    return OptionOut(
        gpu_type=c.device,
        gpus=c.count,
        parallelism=c.parallelism,  # type: ignore[arg-type]
        compiled=c.compiled,
        precision=c.precision,
        gpu_share=c.share,
        description=est.describe(c),
        changes=o.changes,
        peak_memory_bytes=o.peak_bytes,
        memory_basis=o.memory_basis,  # type: ignore[arg-type]
        gpu_memory_bytes=o.capacity_bytes,
        fits=o.fits,
        step_time=step,
        price_per_gpu_hour=o.price,
        hours=o.hours,
        gpu_hours=o.gpu_hours,
        gpu_hours_low=o.gpu_hours_low,
        gpu_hours_high=o.gpu_hours_high,
        cost=o.cost,
        meets_deadline=o.meets_deadline,
    )


def estimate_out(e: Estimate) -> EstimateOut:
    return EstimateOut(
        name=e.name,
        recipe=e.recipe,
        steps=e.steps,
        shape=e.shape,
        deadline=e.deadline,
        currency=e.currency,
        options=[option_out(o) for o in e.options],
        recommended=e.recommended,
        measured_runs=e.measured_runs,
        summary=e.summary,
        notes=e.notes,
        queue=queue_out(e.queue) if e.queue is not None else None,
    )


def queue_out(q: QueueVerdict) -> QueueOut:
    return QueueOut(
        option=q.option,
        expected_start_earliest=q.start.earliest,
        expected_start_latest=q.start.latest,
        expected_start_basis=q.start.basis,
        hosts=list(q.start.hosts),
        latest_end=q.latest_end,
        verdict=q.verdict,  # type: ignore[arg-type]
        sentence=q.sentence,
        passed_over=list(q.passed_over),
    )
