"""A job as readers see it (``JobView``): the shape every read and the submission answer with."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from core.repositories import jobs as jobs_repo


class JobView(NamedTuple):
    """A job as readers see it: names instead of ids, ``steps`` from the spec, the spec as the JSON text it is
    stored as. Every read and the submission answer with this shape (the list rows have these very fields:
    ``jobs_repo.LIST_COLUMNS``)."""

    id: int
    name: str
    team: str
    user: str | None
    state: str
    qos: str
    priority: int
    gpus: int
    gpu_type: str | None
    pending_reason: str | None
    pending_message: str | None
    restart_count: int
    last_step: int
    last_loss: float | None
    steps: int
    exit_reason: str | None
    cancel_requested: bool
    submitted_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    queued_s: float  # seconds queued in the waits that ended (the first, every requeue: core.queue_wait)
    waiting_since: datetime | None  # when the wait the job is in began; None when it is not waiting
    held_at: datetime | None  # held since (kiln hold); None when not held
    spec_json: str


assert JobView._fields == jobs_repo.LIST_COLUMNS, "JobView and the list query must have the same fields"
