"""The kinds of event a webhook may ask for, named once: ``core.webhooks`` sends them, the API's schema and the CLI's
``--events`` list them (the CLI imports this module, not ``core.webhooks`` and its database models)."""

from __future__ import annotations

from typing import Literal, get_args

EventKind = Literal["finished", "failed", "cancelled", "preempted", "restarted", "sla_violation", "sweep_finished"]
KINDS: tuple[str, ...] = get_args(EventKind)
SWEEP_KIND: EventKind = "sweep_finished"  # heard by a team's hooks, not by a hook on one job
