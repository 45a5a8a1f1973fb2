"""``kiln why`` (why a job waits, and what would let it start) and ``kiln metrics`` (how its training goes)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from cli import output as out
from cli.app import OutputOpt, app, client, examples, page_items
from cli.commands.job_input import JobArg
from cli.output import OutputFormat, console


@app.command(epilog=examples("kiln why 7", "kiln why 7 -o json"))
def why(job_id: JobArg, output: OutputOpt = OutputFormat.table) -> None:
    """Why a job is waiting (the scheduler's pending reason) and what would let it start."""
    with client() as api:
        data = api.get(f"/v1/jobs/{job_id}/why")
    if output is not OutputFormat.table:
        out.print_data(data, output)
        return
    reason, message = data.get("pending_reason"), data.get("pending_message")
    if reason:
        console.print(Text.assemble(out.text(reason, "bold"), out.text(f": {message}" if message else "")))
    elif data.get("state") == "QUEUED":
        console.print(out.text(f"job {job_id} is QUEUED and not planned yet (the scheduler runs every few seconds)"))
    elif data.get("exit_reason"):  # a finished job: how it ended (a cancel's reason, a failure's error)
        console.print(out.text(f"job {job_id} is {data.get('state')}: {data['exit_reason']}"))
    else:
        console.print(out.text(f"job {job_id} is {data.get('state')}: not waiting"))
    start = out.expected_start(data)
    if start:
        console.print(out.text(f"expected start: {start}"))
    hints = data.get("unblock") or []
    if hints:
        console.print("what would let it start:")
        for hint in hints:
            console.print(out.text(f"  - {hint}"))


@app.command(epilog=examples("kiln metrics 7 -n 5"))
def metrics(
    job_id: JobArg,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="The last this many points.")] = 20,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """A job's training metrics (step, loss, throughput...)."""
    with client() as api:
        points = page_items(api.get(f"/v1/jobs/{job_id}/metrics"))[-limit:]
    out.render(points, output, lambda: out.table(out.METRIC_COLUMNS, points))
