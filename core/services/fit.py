"""Does a request fit the cluster? GPU types and memory, checked at submit and when a quota names a type.

The rules, as a user meets them:
- a GPU type is written either way (``H200``, ``NVIDIA H200``, ``h100-80gb``) and stored as its canonical type; a
  family name (``H100``) matches any of its variants the cluster has (``H100-80GB``), a variant only itself;
- once any host has registered, a job no set of the hosts could ever hold (a GPU type no host has, more GPUs of
  one type or more CPU slots than all the hosts together, a ``gpus_per_node`` too few hosts have) is refused with
  what the cluster has and the largest request it could hold (``core.host_fit``, which the scheduler's
  ``Unschedulable`` asks too); an operator may accept such jobs to wait for hosts that will join
  (``KILN_ACCEPT_BEYOND_CAPACITY``, or the type declared in ``KILN_GPU_TYPES``), and before any host has registered
  every job is accepted: both then wait as ``Unschedulable``, and the answer says so;
- a job whose predicted per-GPU peak exceeds its QoS class's memory cap is refused, naming the classes whose cap
  fits; one that exceeds the largest GPU of its type is refused with that GPU's size;
- a fractional job's share (``resources.gpu_share``) stays within its class's caps and must hold its predicted
  peak; a share needs a memory size, its own or its class's cap.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from core.gpu_types import GpuTypeError, canonical, canonical_key, matches
from core.host_fit import Ask, Capacity
from core.memory import predict_for_spec
from core.repositories import cluster as cluster_repo
from core.repositories import qos as qos_repo
from core.services.errors import InvalidInput
from core.settings import Settings
from core.spec import JobSpec, check_recipe

GIB = 2**30


@dataclass(frozen=True)
class FitSettings:
    """What an operator lets through beyond the registered hosts, from the process's settings: the services are
    given it (the API and the scheduler pass their own; the defaults are the settings' defaults)."""

    accept_beyond_capacity: bool = False  # KILN_ACCEPT_BEYOND_CAPACITY
    gpu_types: tuple[str, ...] = ()  # KILN_GPU_TYPES: the types of hosts that will join

    @classmethod
    def of(cls, settings: Settings) -> FitSettings:
        return cls(accept_beyond_capacity=settings.accept_beyond_capacity, gpu_types=tuple(settings.gpu_types))


@dataclass(frozen=True)
class Fitted:
    spec: JobSpec  # with the canonical GPU type
    predicted_memory_bytes: int | None  # per GPU; None for CPU jobs and recipes kiln cannot predict
    waits_for: str | None = None  # accepted beyond what the registered hosts could ever hold: what they lack


def canonical_gpu_type(spec: JobSpec) -> JobSpec:
    """The spec with its GPU type in canonical form (unchanged for CPU jobs and "any type")."""
    if not spec.resources.gpus or spec.resources.gpu_type is None:
        return spec
    try:
        gpu_type = canonical(spec.resources.gpu_type)
    except GpuTypeError as exc:
        raise InvalidInput.at("resources.gpu_type", str(exc)) from None
    return spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpu_type": gpu_type})})


def declared_types(fit: FitSettings) -> set[str]:
    return {canonical(t) for t in fit.gpu_types}


def refuse_unknown_type(gpu_type: str, known: Iterable[str], *, loc: str) -> InvalidInput:
    names = sorted(known)
    close = difflib.get_close_matches(gpu_type, names, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InvalidInput.at(
        loc,
        f"no host has GPUs of type {gpu_type!r}{hint} (the cluster has: {', '.join(names)}; an operator declares "
        "the types of hosts that will join in KILN_GPU_TYPES)",
        "unknown_gpu_type",
    )


def check_quota_type(db: Session, name: str, *, loc: str, fit: FitSettings) -> str:
    """A quota's GPU type in canonical form; refused when the cluster has GPUs and none of this type."""
    try:
        key = canonical_key(name)
    except GpuTypeError as exc:
        raise InvalidInput.at(loc, str(exc)) from None
    if key in ("*", "cpu"):
        return key
    registered = cluster_repo.gpu_types(db)
    declared = declared_types(fit)
    if registered and key not in registered and key not in declared:
        raise refuse_unknown_type(key, set(registered) | declared, loc=loc)
    return key


def share_of(asked: Any, cap: int | None, sm_percent: int) -> tuple[int | None, int] | None:
    """A fractional job's (GPU memory bytes, SM percent): what ``resources.gpu_share`` asks, the class's cap and
    SM percentage for what it leaves out; None for a job that is not fractional."""
    if not isinstance(asked, dict):
        return None
    gb = asked.get("memory_gb")
    memory = int(float(gb) * GIB) if gb is not None else cap
    sm = asked.get("sm_percent")
    return memory, int(sm) if sm is not None else sm_percent


def _check_share(spec: JobSpec, cap: int | None, sm_percent: int, qos_name: str, predicted: int | None) -> None:
    asked = spec.resources.gpu_share
    resolved = share_of(asked.model_dump() if asked is not None else None, cap, sm_percent)
    if resolved is None:
        return
    memory, sm = resolved
    loc = "resources.gpu_share"
    if memory is None:
        raise InvalidInput.at(
            f"{loc}.memory_gb",
            f"the {qos_name} class has no GPU memory cap to share by: say how much GPU memory the job gets (memory_gb)",
        )
    if cap is not None and memory > cap:
        raise InvalidInput.at(
            f"{loc}.memory_gb",
            f"{memory / GIB:.1f} GiB is over the {qos_name} class's memory cap of {cap / GIB:.1f} GiB",
        )
    if sm > sm_percent:
        raise InvalidInput.at(f"{loc}.sm_percent", f"{sm}% is over the {qos_name} class's SM share of {sm_percent}%")
    if predicted is not None and predicted > memory:
        raise InvalidInput.at(
            f"{loc}.memory_gb",
            f"predicted peak {predicted / GIB:.1f} GiB does not fit the share of {memory / GIB:.1f} GiB (a larger "
            "share, or a lower batch_size)",
            "memory_fit",
        )


NO_HOST_YET = "no host has registered yet"


def _ask(spec: JobSpec) -> Ask:
    r = spec.resources
    return Ask(r.gpus, r.gpu_type if r.gpus else None, r.gpus_per_node, r.cpu_slots)


def _surely_fits(ask: Ask, ctx: Any) -> bool:
    """What the submission's one read already proves, so that the hosts are read only for the rest: a CPU job within
    every host's slots together, a typed job without a per-host count within its type's usable GPUs."""
    if ask.gpus == 0:
        return ask.cpu_slots <= (ctx.cluster_cpu_slots or 0)
    spans = not ask.gpus_per_node or ask.gpus_per_node >= ask.gpus
    return ask.gpu_type is not None and spans and ask.gpus <= (ctx.type_gpus or 0)


def _refusal(ask: Ask, capacity: Capacity, short: str) -> InvalidInput:
    beyond = " (an operator may accept such jobs to wait for hosts that will join: KILN_ACCEPT_BEYOND_CAPACITY)"
    if ask.gpus and ask.gpu_type is not None and not capacity.types_for(ask.gpu_type):
        close = difflib.get_close_matches(ask.gpu_type, sorted(capacity.per_type), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return InvalidInput.at("resources.gpu_type", short + hint + beyond, "unknown_gpu_type")
    loc = (
        "resources.cpu_slots" if not ask.gpus else "resources.gpus_per_node" if ask.gpus_per_node else "resources.gpus"
    )
    return InvalidInput.at(loc, short + beyond, "unschedulable")


def _declared(asked: str | None, declared: set[str]) -> bool:
    """Whether an operator declared a type ``asked`` matches (any type for None) for hosts that will join."""
    return any(asked is None or matches(asked, d) for d in declared)


def check_capacity(db: Session, *, spec: JobSpec, ctx: Any, fit: FitSettings) -> str | None:
    """Refuse a job no set of the registered hosts could ever hold (``core.host_fit``, the scheduler's own test of
    ``Unschedulable``), naming what the cluster has. None when some set can hold it. Accepted instead, with why it
    waits for hosts that have not joined (returned): when an operator allows it (``KILN_ACCEPT_BEYOND_CAPACITY``,
    or its GPU type declared in ``KILN_GPU_TYPES``), or before any host has registered -- a fresh deployment whose
    workers have not joined yet has nothing to compare with, and refusing everything there would be wrong."""
    if not ctx.cluster_hosts:
        return NO_HOST_YET
    ask = _ask(spec)
    if _surely_fits(ask, ctx):
        return None
    capacity = Capacity(cluster_repo.capacity(db))
    short = capacity.shortfall(ask)
    if short is None:
        return None
    declared = declared_types(fit)
    if fit.accept_beyond_capacity or (ask.gpus and _declared(ask.gpu_type, declared)):
        return short
    raise _refusal(ask, capacity, short)


def check_submission(db: Session, *, spec: JobSpec, ctx: Any, qos_name: str, fit: FitSettings) -> Fitted:
    """``spec`` already has its canonical GPU type; ``ctx`` is the submission context (the QoS class's memory cap
    and what the cluster has of the type). Raises SpecError or InvalidInput."""
    hyperparameters = check_recipe(spec)
    gpu_type = spec.resources.gpu_type
    waits_for = check_capacity(db, spec=spec, ctx=ctx, fit=fit)
    predicted = predict_for_spec(spec, hyperparameters) if hyperparameters is not None else None
    cap = ctx.gpu_memory_cap_bytes
    if spec.resources.gpu_share is not None:
        qos = qos_repo.get_by_name(db, qos_name)
        _check_share(spec, cap, qos.sm_percent if qos is not None else 100, qos_name, predicted)
    if predicted is None:
        return Fitted(spec, None, waits_for)
    if cap is not None and predicted > cap:
        fitting = [q.name for q in qos_repo.list_all(db) if (q.gpu_memory_cap_bytes or predicted) >= predicted]
        raise InvalidInput.at(
            "sla.qos",
            f"predicted peak {predicted / GIB:.1f} GiB per GPU exceeds the {qos_name} class's memory cap of "
            f"{cap / GIB:.1f} GiB; classes whose cap fits: {', '.join(fitting) or 'none'} (or lower batch_size, "
            "or shard with parallelism: fsdp on more GPUs)",
            "memory_fit",
        )
    largest = ctx.type_max_memory
    if largest is not None and predicted > largest:
        what = f"the largest {gpu_type} GPU" if gpu_type else "the largest GPU in the cluster"
        raise InvalidInput.at(
            "resources",
            f"predicted peak {predicted / GIB:.1f} GiB per GPU; {what} has {largest / GIB:.1f} GiB (lower batch_size, "
            "or shard with parallelism: fsdp on more GPUs)",
            "memory_fit",
        )
    return Fitted(spec, predicted, waits_for)
