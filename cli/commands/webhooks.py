"""``kiln webhooks``: create, list, delete, test, and each hook's delivery log (docs/notifications.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli import output as out
from cli.app import OutputOpt, cli_name, client, examples, show_list
from cli.errors import CliError
from cli.output import OutputFormat, console
from core.webhook_kinds import KINDS

webhooks_app = typer.Typer(
    help="Webhooks: signed notifications when a job finishes, fails, is preempted or restarted, or breaks its SLA.",
    no_args_is_help=False,
)


@webhooks_app.callback(invoke_without_command=True, epilog=examples("kiln webhooks --team vision"))
def webhooks(
    ctx: typer.Context,
    team: Annotated[str | None, typer.Option("--team", help="Only this team's hooks.")] = None,
    job: Annotated[int | None, typer.Option("--job", help="Only this job's hooks.")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """The webhooks you manage (subcommands: create, delete, test, deliveries)."""
    if ctx.invoked_subcommand is not None:
        return
    params = {k: v for k, v in (("team", team), ("job_id", job)) if v is not None}
    columns: list[out.Column] = [
        ("ID", lambda h: h.get("id")),
        ("TEAM", lambda h: h.get("team")),
        ("JOB", lambda h: h.get("job_id") or "all"),
        ("EVENTS", lambda h: ",".join(h.get("events") or [])),
        ("FORMAT", lambda h: h.get("format")),
        ("URL", lambda h: h.get("url")),
    ]
    show_list("/v1/webhooks", columns, output, params)


@webhooks_app.command(
    "create",
    epilog=examples(
        "kiln webhooks create https://example.com/hook --team vision --events failed",
        "kiln webhooks create https://hooks.slack.com/services/T/B/X --job 42 --slack",
    ),
)
def create(
    url: Annotated[str, typer.Argument(help="Where to POST (http:// or https://).")],
    team: Annotated[str | None, typer.Option("--team", help="Every job of this team (team-admins).")] = None,
    job: Annotated[int | None, typer.Option("--job", help="Only this job (members of its team).")] = None,
    events: Annotated[str, typer.Option("--events", help=f"Comma-separated: {', '.join(KINDS)}.")] = "finished,failed",
    slack: Annotated[bool, typer.Option("--slack", help='Send Slack\'s {"text": ...} body.')] = False,
    description: Annotated[str, typer.Option("--description", help="A note for the list.")] = "",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Create a webhook; its signing secret is shown once."""
    if team is None and job is None:
        raise CliError("name --team (every job of the team) or --job (one job)")
    body: dict[str, Any] = {
        "url": url,
        "events": [e.strip() for e in events.split(",") if e.strip()],
        "format": "slack" if slack else "json",
        "description": description,
    }
    if team is not None:
        body["team"] = team
    if job is not None:
        body["job_id"] = job
    with client() as api:
        data = api.post("/v1/webhooks", json=body)
    if output is OutputFormat.json:
        out.print_json(data)
        return
    scope = f"job {data.get('job_id')}" if data.get("job_id") else f"every job of team {data.get('team')}"
    console.print(out.text(f"webhook {data.get('id')} created for {scope} ({', '.join(data.get('events') or [])})"))
    console.print(out.text("signing secret (shown only this once; receivers verify Kiln-Signature with it):"))
    console.print(data.get("secret"), markup=False)


@webhooks_app.command("delete", epilog=examples("kiln webhooks delete 3"))
def delete(hook_id: int) -> None:
    """Delete a webhook (its pending deliveries are dropped)."""
    with client() as api:
        api.delete(f"/v1/webhooks/{hook_id}")
    console.print(f"webhook {hook_id} deleted")


@webhooks_app.command("test", epilog=examples("kiln webhooks test 3"))
def test(hook_id: int, output: OutputOpt = OutputFormat.table) -> None:
    """Queue a signed test delivery (it goes out behind the hook's pending ones)."""
    with client() as api:
        data = api.post(f"/v1/webhooks/{hook_id}/test")
    if output is OutputFormat.json:
        out.print_json(data)
        return
    console.print(
        f"test delivery {data.get('id')} queued for webhook {hook_id}; see: {cli_name()} webhooks deliveries {hook_id}"
    )


@webhooks_app.command("deliveries", epilog=examples("kiln webhooks deliveries 3 -n 20"))
def deliveries(
    hook_id: int,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many, newest first.")] = 20,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """A webhook's delivery log: status, attempts, the receiver's last answer."""
    columns: list[out.Column] = [
        ("ID", lambda d: d.get("id")),
        ("KIND", lambda d: d.get("kind")),
        ("JOB", lambda d: (d.get("payload") or {}).get("job", {}).get("id") or "-"),
        ("STATUS", lambda d: d.get("status")),
        ("ATTEMPTS", lambda d: d.get("attempts")),
        ("HTTP", lambda d: d.get("last_status_code") or "-"),
        ("CREATED", lambda d: out.fmt_age(d.get("created_at"))),
        ("NEXT TRY", lambda d: out.fmt_time(d.get("next_attempt_at")) if d.get("status") == "pending" else "-"),
        ("LAST ERROR", lambda d: d.get("last_error") or ""),
    ]
    show_list(f"/v1/webhooks/{hook_id}/deliveries", columns, output, limit=limit)
