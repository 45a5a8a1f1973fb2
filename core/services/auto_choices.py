"""What kiln chooses at submit where a spec says ``auto`` explicitly, and why (the SUBMITTED event says both).

* ``checkpointing.every: auto``: Young/Daly's interval (``core.checkpoint_interval``) from the checkpoint's cost,
  predicted from its size (weights and AdamW moments, 12 bytes a parameter, written at 1 GB/s:
  ``checkpoint_advice``'s own prior) and the failure rate kiln has seen on the GPU type (``failure_rates``), over the
  job's hosts; within the contract's checkpoint interval where it has one. Stored as ``every_seconds``.
* ``compile: {mode: auto}`` and ``parallelism: auto``, written out: the cheapest of the job's measured options
  (``core.services.estimates``) on its GPU type and count that fits and meets the deadline; with nothing measured to
  compare, the trainer's own rules stand (compile: whole on a GPU, regional on the CPU; parallelism: FSDP2 once a
  replica's predicted peak passes 85% of the GPU) and the event says so. Left to their default they cost the
  submission nothing: only a spec that asks is priced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from core import estimate as est
from core.checkpoint_interval import daly_interval_s
from core.memory import predict_for_spec
from core.recipes import TrainingHyperparameters
from core.services.checkpoint_advice import PREDICTED_WRITE_BYTES_PER_S, PRIOR_MTBF_H, FailureRate, failure_rates
from core.services.estimates import priced_options
from core.settings import get_settings
from core.spec import JobSpec, check_recipe

CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights 4 + AdamW's two moments 8


@dataclass(frozen=True)
class Chosen:
    spec: JobSpec  # with what was chosen written in
    said: list[str] = field(default_factory=list)  # for the SUBMITTED event's message
    data: dict[str, Any] = field(default_factory=dict)  # field -> {"chose": value, "why": text}
    relaid: bool = False  # compile or parallelism changed: the predicted memory is the new layout's

    def memory_bytes(self, submitted: int | None) -> int | None:
        """The job's predicted peak per GPU: ``submitted`` (the spec as written's), or the chosen layout's."""
        if not self.relaid:
            return submitted
        hp = check_recipe(self.spec)
        return predict_for_spec(self.spec, hp) if hp is not None else submitted


def choose(db: Session, *, spec: JobSpec, team_id: int, contract_interval_s: float | None, now: datetime) -> Chosen:
    """``spec`` with kiln's choices for the fields it set to ``auto`` explicitly (unchanged when none)."""
    asked_compile = "mode" in spec.compile.model_fields_set and spec.compile.mode == "auto"
    asked_layout = "parallelism" in spec.model_fields_set and spec.parallelism == "auto"
    asked_every = spec.checkpointing.every == "auto"
    if not (asked_compile or asked_layout or asked_every):
        return Chosen(spec)
    hp = check_recipe(spec)
    options = priced_options(db, spec=spec, hp=hp, team_id=team_id, now=now, prices=get_settings().gpu_prices).options
    chosen = Chosen(spec)
    if asked_compile or asked_layout:
        chosen = _layout(chosen, options, asked_compile, asked_layout)
    if asked_every:
        chosen = _interval(db, chosen, hp, options[0].config.device, contract_interval_s, now)
    return chosen


def _layout(chosen: Chosen, options: list[est.Option], compile_: bool, layout: bool) -> Chosen:
    """The cheapest measured option of the job's own device, count and share, free only in what says auto."""
    written = options[0].config
    same = [
        o
        for o in options
        if (o.config.device, o.config.count, o.config.share) == (written.device, written.count, written.share)
        and (compile_ or o.config.compiled == written.compiled)
        and (layout or o.config.parallelism == written.parallelism)
    ]
    measured = [o for o in same if o.step is not None and o.step.basis == "measured"]
    best = est.cheapest(measured)
    spec, said, data = chosen.spec, list(chosen.said), dict(chosen.data)
    if best is None:
        why = "no measured runs of this shape on its GPUs to compare: the trainer's own rule"
        for name, asked in (("compile.mode", compile_), ("parallelism", layout)):
            if asked:
                data[name] = {"chose": "auto", "why": why}
        said.append(f"auto left to the trainer ({why})")
        return Chosen(spec, said, data)
    pick = measured[best].config
    unit = "slot-h" if pick.device == "cpu" else "GPU-h"
    others = "; ".join(
        f"{est.describe(o.config)}: {o.gpu_hours:.3g} {unit}" for o in measured if o is not measured[best]
    )
    why = f"the cheapest measured at {measured[best].gpu_hours:.3g} {unit}" + (f" ({others})" if others else "")
    if compile_:
        mode = "auto" if pick.compiled else "off"
        spec = spec.model_copy(update={"compile": spec.compile.model_copy(update={"mode": mode})})
        data["compile.mode"] = {"chose": "compiled" if pick.compiled else "off", "why": why}
    if layout and pick.parallelism != est.SINGLE:
        spec = spec.model_copy(update={"parallelism": pick.parallelism})
        data["parallelism"] = {"chose": pick.parallelism, "why": why}
    said.append(f"auto chose {est.describe(pick)}: {why}")
    return Chosen(spec, said, data, relaid=spec is not chosen.spec)


def _interval(
    db: Session,
    chosen: Chosen,
    hp: TrainingHyperparameters | None,
    device: str,
    contract_s: float | None,
    now: datetime,
) -> Chosen:
    spec = chosen.spec
    if hp is None:
        why = "kiln cannot size this code's checkpoint before it runs: every 100 steps"
        return _set_interval(chosen, spec.checkpointing.model_copy(update={"every": None}), "every 100 steps", why)
    params = hp.shape().param_count()
    cost_s = params * CHECKPOINT_BYTES_PER_PARAM / PREDICTED_WRITE_BYTES_PER_S
    rate = failure_rates(db, now).get(device) or FailureRate(device, 0, 0.0, PRIOR_MTBF_H, True)
    hosts = spec.resources.nodes
    interval = daly_interval_s(cost_s, rate.mtbf_h * 3600.0 / hosts)
    seen = f"{rate.failures} failure(s) in {rate.host_hours:.0f} host-hours" + (
        f" and a prior of 1 in {PRIOR_MTBF_H:.0f}" if rate.from_prior else ""
    )
    why = (
        f"Young/Daly: a save of ~{cost_s:.2g} s predicted from its size ({params / 1e6:.3g}M parameters at "
        f"{PREDICTED_WRITE_BYTES_PER_S / 1e9:.0f} GB/s), MTBF {rate.mtbf_h:.0f} h on {device} from {seen}"
        + (f" over {hosts} hosts" if hosts > 1 else "")
    )
    if contract_s is not None and interval > contract_s:
        interval, why = contract_s, why + f"; held to the contract's checkpoint interval of {contract_s:.0f} s"
    every_s = max(1, round(interval))  # whole seconds, and never 0 (the spec's every_seconds is > 0)
    ckpt = spec.checkpointing.model_copy(update={"every": None, "every_steps": None, "every_seconds": every_s})
    return _set_interval(chosen, ckpt, f"every {every_s} s", why)


def _set_interval(chosen: Chosen, ckpt: Any, what: str, why: str) -> Chosen:
    spec = chosen.spec.model_copy(update={"checkpointing": ckpt})
    data = {**chosen.data, "checkpointing.every": {"chose": what, "why": why}}
    return Chosen(spec, [*chosen.said, f"checkpoint {what} ({why})"], data, chosen.relaid)
