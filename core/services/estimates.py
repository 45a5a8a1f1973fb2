"""``kiln estimate`` / ``POST /v1/estimates``: a spec's options before it runs, each with its memory, step time,
GPU-hours and cost, and the cheapest that fits and meets the deadline. Nothing is created.

The options are the job as written and what kiln could change: each GPU type the cluster has (the CPU for a CPU
job), 1, 2, 4, ... GPUs up to what the cluster has of the type (a built-in recipe only, its per-rank batch scaled
so that the global batch, and so the training, stays the same), DDP or FSDP2 on more than one GPU, compiled or eager,
and a share of one GPU where hosts run MPS. Memory is ``core.memory``'s prediction (a team's own code: the peak
its measured runs reached); step times are ``core.estimate``'s from ``core.services.calibration`` (measured, scaled
by FLOPs, or scaled from another GPU type by its published peaks).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from core import estimate as est
from core.gpu_types import matches
from core.host_fit import Capacity
from core.memory import predict
from core.models import Role
from core.recipes import TrainingHyperparameters
from core.repositories import cluster as cluster_repo
from core.repositories import estimates as repo
from core.repositories import teams as teams_repo
from core.services.calibration import history, resolved_precision, shape_of
from core.services.capacity import price_for
from core.services.errors import InvalidInput
from core.services.estimate_queue import QueueVerdict, WouldBe, WouldStart, choose, verdict, with_changes
from core.services.fit import FitSettings, canonical_gpu_type, check_capacity
from core.services.principal import Principal, require_team_id
from core.services.sla import DEFAULT_QOS, TERMS
from core.spec import JobSpec, check_recipe

HEADROOM = 0.85  # parallelism auto shards once a replica's predicted peak passes this share of the GPU (trainer)
MAX_GPUS = 64  # the largest count offered (powers of two up to the cluster's own)
GIB = 2**30


@dataclass(frozen=True)
class Estimate:
    name: str
    recipe: str
    steps: int
    shape: str
    deadline: datetime | None
    currency: str
    options: list[est.Option]  # as ``Priced.options``
    recommended: int | None  # index into options
    measured_runs: int  # the recipe's measured attempts kiln read
    summary: str
    notes: list[str]
    queue: QueueVerdict | None = None  # with a deadline: the chosen option's expected start counted


@dataclass(frozen=True)
class _Cluster:
    memory: dict[str, int]  # GPU type -> its largest GPU's bytes
    totals: dict[str, int]  # GPU type -> usable GPUs on all hosts; "cpu" -> CPU slots
    shares: set[str]  # GPU types where a share can run
    qos_cap: int | None


def estimate(
    *,
    db: Session,
    principal: Principal,
    spec: JobSpec,
    now: datetime,
    prices: dict[str, float],
    currency: str,
    fit: FitSettings = FitSettings(),
    would_start: WouldStart | None = None,
) -> Estimate:
    """Raises SpecError / InvalidInput for a spec that could not be submitted, NotFound for a team not in view.
    ``would_start``: the scheduler's projection of a job not yet submitted (None: the queue is not counted)."""
    spec = canonical_gpu_type(spec)
    hp = check_recipe(spec)
    team_id = require_team_id(principal, teams_repo.id_by_name(db, spec.team), spec.team, Role.VIEWER)
    ctx = _refuse_as_submit_would(db, spec, fit)
    priced = priced_options(db, spec=spec, hp=hp, team_id=team_id, now=now, prices=prices)
    options = priced.options
    best = est.cheapest(options, written=0)
    queue = None
    if priced.deadline is not None and would_start is not None:
        deadline = priced.deadline
        qos_id, priority = (ctx.qos_id, int(ctx.priority or 0)) if ctx is not None else (None, 0)
        start_of = would_start(db, now)  # the queue read once for every option projected

        def project(i: int) -> QueueVerdict:
            o = options[i]
            would = WouldBe(with_changes(spec, o.changes), team_id, qos_id, priority, o.peak_bytes)
            return verdict(i, o, start_of(would), deadline)

        best, queue = choose(options, project)
    return Estimate(
        name=spec.name,
        recipe=spec.recipe_name,
        steps=spec.steps,
        shape=options[0].shape.label,
        deadline=priced.deadline,
        currency=currency,
        options=options,
        recommended=best,
        measured_runs=priced.measured_runs,
        summary=_summary(options, best, priced.measured_runs, currency, priced.deadline, queue),
        notes=_notes(spec, hp, priced.shares, counted=queue is not None),
        queue=queue,
    )


@dataclass(frozen=True)
class Priced:
    options: list[est.Option]  # the job as written first, then by cost (options without one last)
    measured_runs: int
    deadline: datetime | None
    shares: bool  # some host runs MPS


def priced_options(
    db: Session,
    *,
    spec: JobSpec,
    hp: TrainingHyperparameters | None,
    team_id: int,
    now: datetime,
    prices: dict[str, float],
) -> Priced:
    """Every option of ``spec`` (its GPU type canonical, its recipe checked), priced from the recipe's history (a
    team's own code: the team's runs only)."""
    cluster = _cluster(db, spec)
    own_code = spec.code is not None or spec.command is not None
    recipe = spec.recipe.name if spec.recipe is not None else None  # None: a script's runs
    runs = history(db, recipe=recipe, team_id=team_id if own_code else None)
    deadline = datetime.fromisoformat(spec.sla.deadline) if spec.sla.deadline else None
    written = _as_written(spec, hp, cluster, prices)
    options = [_priced(o, spec, runs, prices, now, deadline) for o in _options(spec, hp, cluster, written)]
    options.sort(key=lambda o: (o.config != written, o.cost is None, o.cost or 0.0))
    return Priced(options, len(runs), deadline, bool(cluster.shares))


def _refuse_as_submit_would(db: Session, spec: JobSpec, fit: FitSettings) -> Any:
    """What no option can mend is refused as a submission is (422, the field's path): a QoS class that does not
    exist, a request no set of the hosts could ever hold (a GPU type no host has, more GPUs than the cluster)."""
    asked = spec.resources.gpu_type if spec.resources.gpus else None
    ctx = teams_repo.submission_context(
        db, team=spec.team, qos=spec.sla.qos, default_qos=DEFAULT_QOS, terms=TERMS, gpu_type=asked
    )
    if spec.sla.qos is not None and ctx.qos_id is None:
        raise InvalidInput.at("sla.qos", f"unknown QoS class {spec.sla.qos!r}")
    check_capacity(db, spec=spec, ctx=ctx, fit=fit)
    return ctx


def _cluster(db: Session, spec: JobSpec) -> _Cluster:
    capacity = Capacity(cluster_repo.capacity(db))
    totals: dict[str, int] = {**capacity.total, "cpu": sum(capacity.cpu)}
    ctx = teams_repo.submission_context(
        db, team=spec.team, qos=spec.sla.qos, default_qos=DEFAULT_QOS, terms=TERMS, gpu_type=None
    )
    cap = ctx.gpu_memory_cap_bytes if ctx is not None else None
    return _Cluster(cluster_repo.gpu_types(db), totals, repo.share_gpu_types(db), cap)


def _devices(spec: JobSpec, cluster: _Cluster) -> list[str]:
    """The CPU for a CPU job; else each GPU type the cluster has, or the type asked for before any has joined."""
    if not spec.resources.gpus:
        return ["cpu"]
    return sorted(cluster.memory) or [spec.resources.gpu_type or "*"]


def _as_written(
    spec: JobSpec, hp: TrainingHyperparameters | None, cluster: _Cluster, prices: dict[str, float]
) -> est.Config:
    """The configuration the job as written runs in: the cheapest of the cluster's GPU types it matches, ``auto``
    parallelism and compile as the trainer resolves them."""
    r = spec.resources
    count = r.gpus or r.cpu_slots
    device = "cpu"
    if r.gpus:
        asked = r.gpu_type
        matching = [t for t in cluster.memory if asked is None or matches(asked, t)]
        device = min(matching, key=lambda t: (price_for(prices, t), t)) if matching else asked or "*"
    config = est.Config(
        device, count, est.SINGLE, spec.compile.mode != "off", resolved_precision(spec), r.gpu_share is not None
    )
    if count == 1:
        return config
    parallelism = spec.parallelism
    if parallelism == "auto":
        peak = _memory(replace(config, parallelism="ddp"), hp)
        room = _capacity(config, spec, cluster)
        parallelism = "fsdp" if peak is not None and room is not None and peak > HEADROOM * room else "ddp"
    return replace(config, parallelism=parallelism)


def _counts(spec: JobSpec, hp: TrainingHyperparameters | None, device: str, cluster: _Cluster) -> list[int]:
    """1, 2, 4, ... up to what the cluster has of ``device``, where the global batch divides evenly (and a gang's
    per-host count); only the written count for a recipe whose batch kiln does not know."""
    r = spec.resources
    written = r.gpus or r.cpu_slots
    if hp is None or not hasattr(hp, "batch_size"):
        return [written]
    top = min(MAX_GPUS, cluster.totals.get(device, 0) or written)
    powers = {2**i for i in range(7) if 2**i <= top} | {written}
    per_node = r.gpus_per_node
    fits = [n for n in sorted(powers) if (hp.batch_size * written) % n == 0]
    return [n for n in fits if per_node is None or n % per_node == 0 or n < per_node]


def _options(
    spec: JobSpec, hp: TrainingHyperparameters | None, cluster: _Cluster, written: est.Config
) -> list[est.Option]:
    precision = written.precision
    configs: list[est.Config] = [written]
    for device in _devices(spec, cluster):
        for n in _counts(spec, hp, device, cluster):
            layouts = [est.SINGLE] if n == 1 else ["ddp", "fsdp"] if device != "cpu" else ["ddp"]
            for layout in layouts:
                configs += [est.Config(device, n, layout, c, precision) for c in (True, False)]
        if device in cluster.shares:
            configs += [est.Config(device, 1, est.SINGLE, c, precision, share=True) for c in (True, False)]
    unique = list(dict.fromkeys(configs))
    return [_option(spec, hp, c, written, cluster) for c in unique]


def _option(
    spec: JobSpec, hp: TrainingHyperparameters | None, config: est.Config, written: est.Config, cluster: _Cluster
) -> est.Option:
    hp_here = hp
    changes: dict[str, object] = {}
    if config.device != written.device:
        changes["resources.gpu_type"] = config.device
    if config.count != written.count:
        changes["resources.gpus" if config.device != "cpu" else "resources.cpu_slots"] = config.count
        per_node = spec.resources.gpus_per_node
        if config.device != "cpu" and per_node is not None and config.count < per_node:
            changes["resources.gpus_per_node"] = None  # fewer GPUs than a host's share: one host, any count
        if hp is not None and hasattr(hp, "batch_size"):
            per_rank = hp.batch_size * written.count // config.count
            hp_here = hp.model_copy(update={"batch_size": per_rank})
            changes["recipe.hyperparameters.batch_size"] = per_rank
    if config.parallelism not in (est.SINGLE, _written_parallelism(spec, written)):
        changes["parallelism"] = config.parallelism
    if config.compiled != written.compiled:
        changes["compile.mode"] = "auto" if config.compiled else "off"
    if config.share != written.share:
        changes["resources.gpu_share"] = {} if config.share else None
    return est.Option(
        config,
        shape_of(spec, hp_here),
        changes,
        _memory(config, hp_here),
        "predicted" if hp_here is not None and config.device != "cpu" else None,
        _capacity(config, spec, cluster),
    )


def _written_parallelism(spec: JobSpec, written: est.Config) -> str:
    """What the spec's parallelism comes to on more than one GPU: as written, or what ``auto`` resolved to (DDP
    where the written job is one process)."""
    if spec.parallelism != "auto":
        return spec.parallelism
    return written.parallelism if written.parallelism != est.SINGLE else "ddp"


def _memory(config: est.Config, hp: TrainingHyperparameters | None) -> int | None:
    """Per GPU, as ``core.memory`` predicts it for a built-in recipe (None on the CPU or for other code)."""
    if hp is None or config.device == "cpu":
        return None
    shape = hp.shape()
    p = predict(
        param_count=shape.param_count(),
        activation_bytes=shape.activation_bytes(config.precision, config.compiled),
        precision=config.precision,
        strategy="fsdp" if config.parallelism == "fsdp" else "ddp",
        world_size=config.count,
        largest_block_params=shape.largest_block_params(),
        grad_accum=hp.grad_accum,
        check_bytes=shape.eager_check_bytes(config.precision) if config.compiled else 0,
    )
    return int(p["predicted_peak_bytes"])


def _capacity(config: est.Config, spec: JobSpec, cluster: _Cluster) -> int | None:
    """What one of the option's GPUs gives the job: the type's largest GPU within the QoS class's cap; a share, the
    share asked for (else the class's cap)."""
    if config.device == "cpu":
        return None
    if config.share:
        asked = spec.resources.gpu_share
        gb = asked.memory_gb if asked is not None else None
        return int(gb * GIB) if gb is not None else cluster.qos_cap
    sizes = [m for m in (cluster.memory.get(config.device), cluster.qos_cap) if m is not None]
    return min(sizes) if sizes else None


def _priced(
    option: est.Option,
    spec: JobSpec,
    runs: list[est.Run],
    prices: dict[str, float],
    now: datetime,
    deadline: datetime | None,
) -> est.Option:
    step = est.step_time(option.shape, option.config, runs)
    peak, basis = option.peak_bytes, option.memory_basis
    if peak is None and step is not None and step.basis == "measured":
        measured = [r.peak_bytes for r in runs if r.config == option.config and r.shape.key == option.shape.key]
        peak = max((p for p in measured if p is not None), default=None)
        basis = "measured" if peak is not None else None
    price = price_for(prices, option.config.device)
    priced = replace(option, step=step, price=price, peak_bytes=peak, memory_basis=basis)
    return est.cost(priced, steps=spec.steps, now=now, deadline=deadline)


def _summary(
    options: list[est.Option],
    best: int | None,
    runs: int,
    currency: str,
    deadline: datetime | None,
    queue: QueueVerdict | None = None,
) -> str:
    if not runs:
        return (
            "no measured history of this recipe yet: step time, GPU-hours and cost cannot be estimated (memory is "
            "predicted where kiln can); run it once, and the next estimate has its measurements"
        )
    written = options[0]
    if not any(o.step is not None for o in options):
        return (
            "no measured run of this recipe matches these options (GPU type, compile, precision): step time, "
            "GPU-hours and cost cannot be estimated; run it once, and the next estimate has its measurements"
        )
    if best is None:
        why = "meets the deadline" if deadline is not None else "fits"
        return f"no option with a measured or scaled step time {why}"
    chosen = options[best]
    what = "cheapest"
    if queue is not None and queue.passed_over:  # the queue chose: a cheaper option would end too late
        what = (
            "cheapest that meets the deadline" if queue.verdict == "meets" else f"best in the queue ({queue.verdict})"
        )
        what += " counting the queue"
    line = f"{what}: {est.describe(chosen.config)}: {_money(chosen, currency)}"
    if best == 0:
        return line + " (the job as written)"
    if written.cost is None:
        return line + "; the job as written has no step time to compare"
    saving = 1 - (chosen.cost or 0.0) / written.cost if written.cost else 0.0
    return line + f"; as written {_money(written, currency)} ({saving:.0%} less)"


def _money(o: est.Option, currency: str) -> str:
    unit = "slot-h" if o.config.device == "cpu" else "GPU-h"
    return f"{o.gpu_hours:.3g} {unit}, {o.cost:.3g} {currency}"


def _notes(spec: JobSpec, hp: TrainingHyperparameters | None, shares: bool, *, counted: bool) -> list[str]:
    notes = ["activation checkpointing: no built-in recipe has it, so it is not an option"]
    if spec.resources.gpus:
        notes.append(
            "a GPU type with no run of this recipe is scaled from another type's runs by their published peak "
            "throughput and memory bandwidth ('scaled from <type>'), with a spread from the one to the other; "
            "a type without published figures in kiln has none"
        )
    if spec.sla.deadline:
        notes.append(
            "each option's DEADLINE counts its run alone; the sentence above counts the queue for the chosen one"
            if counted
            else "the deadline is met if the run alone ends before it: this server does not project the queue"
        )
    if hp is None:
        notes.append("this code's batch is its own: only the GPU count as written is offered")
    if spec.resources.gpus and not shares:
        notes.append("no host runs MPS: no GPU share is offered")
    return notes
