"""``kiln submit --follow`` and ``kiln logs -f``: watch a job live until it ends."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from cli.client import KilnClient, SseEvent
from cli.errors import ExitCode
from cli.output import TERMINAL_STATES, fmt_loss, fmt_time, safe, text
from core.states import JobState

END_EVENTS = frozenset({"end"})


def log_line(event: SseEvent) -> str | None:
    """The text of a ``log`` event (``data`` is the line as the trainer wrote it); None for control events."""
    if event.event in {"log", "message"}:
        return event.data
    return None


def exit_code_for_state(state: str | None) -> ExitCode:
    return ExitCode.OK if state == JobState.SUCCEEDED else ExitCode.FAILURE


def describe_transition(job: dict[str, Any]) -> str:
    state = job.get("state")
    parts = [f"job {job.get('id')} {state}"]
    if state == JobState.QUEUED and job.get("pending_reason"):
        parts.append(f"({job['pending_reason']}: {job.get('pending_message') or ''})".replace(": )", ")"))
    if state in TERMINAL_STATES and job.get("exit_reason"):
        parts.append(f"({job['exit_reason']})")
    if state == JobState.SUCCEEDED and job.get("last_loss") is not None:
        parts.append(f"final loss {fmt_loss(job.get('last_loss'))}")
    return " ".join(parts)


def follow_job(client: KilnClient, job_id: int | str, console: Console, *, poll_s: float = 1.0) -> dict[str, Any]:
    """Show a progress bar of steps with live loss; print each new event; return the final job."""
    job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}")
    event_cursor = [0]
    total = int(job.get("steps") or (job.get("spec") or {}).get("steps") or 0) or None
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[name]}[/] {task.fields[state]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(  # the fields go into markup columns: escaped
            "train",
            total=total,
            name=escape(safe(job.get("name", job_id))),
            state=escape(safe(job.get("state", ""))),
            loss="-",
        )
        while True:
            state = job.get("state")
            for event in _new_events(client, job_id, event_cursor):
                when = fmt_time(event.get("created_at"))
                progress.console.print(
                    Text.assemble((when, "dim"), " ", text(event.get("type", "")), ": ", text(event.get("message", "")))
                )
            progress.update(
                task,
                completed=int(job.get("last_step") or 0),
                state=escape(safe(state or "")),
                loss=fmt_loss(job.get("last_loss")),
            )
            if state in TERMINAL_STATES:
                progress.console.print(text(describe_transition(job)))
                return job
            time.sleep(poll_s)
            job = client.get(f"/v1/jobs/{job_id}")


def _new_events(client: KilnClient, job_id: int | str, cursor: list[int]) -> list[dict[str, Any]]:
    """Events after ``cursor[0]`` (the last event id seen), which is advanced."""
    fresh: list[dict[str, Any]] = []
    while True:
        page = client.get(f"/v1/jobs/{job_id}/events", params={"after": cursor[0], "limit": 500})
        items = page.get("items", []) if isinstance(page, dict) else page
        for event in items or []:
            cursor[0] = max(cursor[0], int(event.get("id") or 0))
            fresh.append(event)
        if not items or not (isinstance(page, dict) and page.get("next_after")):
            return fresh
