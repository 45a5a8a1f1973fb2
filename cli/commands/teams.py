"""Teams and what they get: the ``kiln teams`` and ``kiln sla`` sub-apps, ``kiln qos``, ``usage`` and ``hosts``."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Group

from cli import output as out
from cli.app import OutputOpt, app, client, examples, flatten, show_list
from cli.errors import CliError, ExitCode
from cli.output import OutputFormat, console

teams_app = typer.Typer(help="Teams, their quotas and members.", no_args_is_help=False)
sla_app = typer.Typer(help="A team's default SLA contract.", no_args_is_help=False)
invitations_app = typer.Typer(help="Teams that invited you: accept or decline.", no_args_is_help=False)


@teams_app.callback(invoke_without_command=True, epilog=examples("kiln teams", "kiln teams show default"))
def teams(ctx: typer.Context, output: OutputOpt = OutputFormat.table) -> None:
    """List the teams you can see (subcommands: show, create, set, members, add-member, remove-member,
    invitations)."""
    if ctx.invoked_subcommand is not None:
        return
    show_list("/v1/teams", out.TEAM_COLUMNS, output)


@teams_app.command("show", epilog=examples("kiln teams show default -o json"))
def teams_show(team: str, output: OutputOpt = OutputFormat.table) -> None:
    """A team: quotas, budget, fair-share weight."""
    with client() as api:
        data = api.get(f"/v1/teams/{team}")
    out.render(data, output, lambda: out.kv_table(_flatten_lists(data), title=f"Team {team}"))


def _flatten_lists(data: dict[str, Any]) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for key, value in flatten(data):
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, item in enumerate(value):
                pairs.append((f"{key}[{i}]", ", ".join(f"{k}={out.fmt_value(v)}" for k, v in item.items())))
        else:
            pairs.append((key, value))
    return pairs


def _parse_quota(text: str) -> dict[str, Any]:
    """'H200=8' or 'H200=8:borrow=4:lend=2' -> {gpu_type, nominal, borrowing_limit, lending_limit}."""
    head, *opts = text.split(":")
    gpu_type, sep, nominal = head.partition("=")
    if not sep or not nominal.isdigit() or not gpu_type:
        raise typer.BadParameter(f"{text!r}: expected TYPE=N[:borrow=N][:lend=N], e.g. H200=8 or cpu=4")
    quota: dict[str, Any] = {"gpu_type": gpu_type, "nominal": int(nominal)}
    names = {"borrow": "borrowing_limit", "lend": "lending_limit"}
    for opt in opts:
        key, sep, value = opt.partition("=")
        if key not in names or not value.isdigit():
            raise typer.BadParameter(f"{opt!r}: expected borrow=N or lend=N")
        quota[names[key]] = int(value)
    return quota


@teams_app.command(
    "create", epilog=examples("kiln teams create research --quota cpu=2 --quota H200=8:borrow=4 --cohort lab")
)
def teams_create(
    name: str,
    quota: Annotated[
        list[str] | None, typer.Option("--quota", help="TYPE=N[:borrow=N][:lend=N], repeatable (cpu=4, H200=8).")
    ] = None,
    cohort: Annotated[str | None, typer.Option(help="Cohort whose teams lend to each other.")] = None,
    gpu_hour_budget: Annotated[float | None, typer.Option(help="GPU-hours per budget period.")] = None,
    fair_share_weight: Annotated[float | None, typer.Option(help="Weight in fair share.")] = None,
    qos: Annotated[
        str | None, typer.Option("--qos", help="QoS classes it may use, comma-separated (silver,bronze,best-effort).")
    ] = None,
    restart_limit: Annotated[int | None, typer.Option("--restart-limit", min=0, help="Default 10.")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Create a team (admin)."""
    body: dict[str, Any] = {"name": name, "quotas": [_parse_quota(q) for q in quota or []]}
    if qos is not None:
        body["qos_classes"] = [q.strip() for q in qos.split(",") if q.strip()]
    for key, value in (
        ("cohort", cohort),
        ("gpu_hour_budget", gpu_hour_budget),
        ("fair_share_weight", fair_share_weight),
        ("restart_limit", restart_limit),
    ):
        if value is not None:
            body[key] = value
    with client() as api:
        data = api.post("/v1/teams", json=body)
    out.render(data, output, lambda: f"team {data.get('name', name)} created")


@teams_app.command(
    "set",
    epilog=examples(
        "kiln teams set vision --quota H200=8", "kiln teams set vision --qos gold,silver --restart-limit 5"
    ),
)
def teams_set(
    team: str,
    qos: Annotated[str | None, typer.Option("--qos", help="The QoS classes the team may use, comma-separated.")] = None,
    restart_limit: Annotated[
        int | None, typer.Option("--restart-limit", min=0, help="The most restarts a contract may ask for.")
    ] = None,
    quota: Annotated[
        list[str] | None,
        typer.Option("--quota", help="TYPE=N[:borrow=N][:lend=N], repeatable: sets that type's quota only."),
    ] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Change what a team may use (admin): its QoS classes, restart limit and quotas."""
    body: dict[str, Any] = {}
    if qos is not None:
        body["qos_classes"] = [q.strip() for q in qos.split(",") if q.strip()]
    if restart_limit is not None:
        body["restart_limit"] = restart_limit
    changed = [_parse_quota(q) for q in quota or []]
    if not body and not changed:
        raise CliError("nothing to change: give --qos, --restart-limit and/or --quota", ExitCode.USAGE)
    with client() as api:
        tag = None
        if changed:  # the whole list is replaced: merge with what is there, and only if nobody changed it since
            current, tag = api.get_versioned(f"/v1/teams/{team}")
            replaced = {c["gpu_type"].lower() for c in changed}
            kept = [
                {k: q[k] for k in ("gpu_type", "nominal", "borrowing_limit", "lending_limit")}
                for q in current.get("quotas", [])
                if q["gpu_type"].lower() not in replaced
            ]
            body["quotas"] = kept + changed
        data = api.patch(f"/v1/teams/{team}", json=body, if_match=tag)
    out.render(data, output, lambda: out.kv_table(_flatten_lists(data), title=f"Team {team}"))


@teams_app.command("members", epilog=examples("kiln teams members default"))
def teams_members(team: str, output: OutputOpt = OutputFormat.table) -> None:
    """A team's members and their roles."""
    columns: list[out.Column] = [
        ("USER", lambda m: m.get("user")),
        ("ROLE", lambda m: m.get("role")),
        ("SINCE", lambda m: out.fmt_time(m.get("created_at"))),
    ]
    show_list(f"/v1/teams/{team}/members", columns, output)


@teams_app.command("add-member", epilog=examples("kiln teams add-member research alice --role team-admin"))
def teams_add_member(
    team: str,
    user: str,
    role: Annotated[str, typer.Option(help="team-admin, member or viewer.")] = "member",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Add a user to a team (admin), change a member's role, or invite a user (team-admin): an invited user
    joins with `kiln invitations accept TEAM`."""
    with client() as api:
        data = api.put(f"/v1/teams/{team}/members/{user}", json={"role": role})
    if data.get("status") == "invited":
        text = f"invited {user} to {team} as {role}; they join with: kiln invitations accept {team}"
    else:
        text = f"{user} is {data.get('role', role)} in {team}"
    out.render(data, output, lambda: text)


@teams_app.command("invitations", epilog=examples("kiln teams invitations research"))
def teams_invitations(team: str, output: OutputOpt = OutputFormat.table) -> None:
    """A team's pending invitations (team-admin)."""
    show_list(f"/v1/teams/{team}/invitations", INVITATION_COLUMNS, output)


INVITATION_COLUMNS: list[out.Column] = [
    ("TEAM", lambda i: i.get("team")),
    ("USER", lambda i: i.get("user")),
    ("ROLE", lambda i: i.get("role")),
    ("INVITED BY", lambda i: i.get("invited_by")),
    ("EXPIRES", lambda i: out.fmt_time(i.get("expires_at"))),
]


@invitations_app.callback(
    invoke_without_command=True, epilog=examples("kiln invitations", "kiln invitations accept research")
)
def invitations(ctx: typer.Context, output: OutputOpt = OutputFormat.table) -> None:
    """Teams that invited you (subcommands: accept TEAM, decline TEAM)."""
    if ctx.invoked_subcommand is None:
        show_list("/v1/me/invitations", INVITATION_COLUMNS, output)


@invitations_app.command("accept", epilog=examples("kiln invitations accept research"))
def invitations_accept(team: str) -> None:
    """Join a team that invited you."""
    with client() as api:
        data = api.post(f"/v1/me/invitations/{team}/accept")
    console.print(f"you joined {team} as {data.get('role')}", markup=False)


@invitations_app.command("decline", epilog=examples("kiln invitations decline research"))
def invitations_decline(team: str) -> None:
    """Decline a team's invitation."""
    with client() as api:
        api.post(f"/v1/me/invitations/{team}/decline")
    console.print(f"declined the invitation to {team}", markup=False)


@teams_app.command("remove-member", epilog=examples("kiln teams remove-member research bob"))
def teams_remove_member(team: str, user: str) -> None:
    """Remove a user from a team."""
    with client() as api:
        api.delete(f"/v1/teams/{team}/members/{user}")
    console.print(out.text(f"{user} removed from {team}"))


@app.command(epilog=examples("kiln qos", "kiln qos -o yaml"))
def qos(output: OutputOpt = OutputFormat.table) -> None:
    """QoS classes: priority, preemption, GPU memory and SM caps, bandwidth quotas."""
    columns: list[out.Column] = [
        ("NAME", lambda q: q.get("name")),
        ("PRIO", lambda q: q.get("priority")),
        ("PREEMPTIBLE", lambda q: q.get("preemptible")),
        ("GPU MEM CAP", lambda q: out.fmt_bytes(q.get("gpu_memory_cap_bytes"))),
        ("SM %", lambda q: q.get("sm_percent")),
        ("PCIE", lambda q: out.fmt_rate(q.get("pcie_bandwidth_bytes_per_s"))),
        ("NVLINK", lambda q: out.fmt_rate(q.get("nvlink_bandwidth_bytes_per_s"))),
        (
            "MAX WAIT",
            lambda q: (
                out.fmt_duration(q.get("default_max_queue_wait_s"))
                if q.get("default_max_queue_wait_s") is not None
                else "-"
            ),
        ),
        ("DESCRIPTION", lambda q: q.get("description")),
    ]
    show_list("/v1/qos", columns, output)


@sla_app.callback(invoke_without_command=True, epilog=examples("kiln sla", "kiln sla show research"))
def sla(ctx: typer.Context, output: OutputOpt = OutputFormat.table) -> None:
    """Show your team's default SLA contract (subcommands: show TEAM, set TEAM ...)."""
    if ctx.invoked_subcommand is None:
        sla_show(None, output)


@sla_app.command("show", epilog=examples("kiln sla show research -o json"))
def sla_show(
    team: Annotated[str | None, typer.Argument(help="The team (default: your only team).")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Show a team's default SLA contract."""
    with client() as api:
        team = team or _default_team(api)
        data = api.get(f"/v1/teams/{team}/sla")
    out.render(data, output, lambda: out.kv_table(flatten(data), title=f"SLA contract of team {team}"))


def _default_team(api: Any) -> str:
    me = api.get("/v1/me")
    names = [m.get("team") for m in (me.get("memberships") or me.get("teams") or []) if isinstance(m, dict)]
    if len(names) == 1 and names[0]:
        return str(names[0])
    raise CliError(f"say which team: you belong to {', '.join(map(str, names)) or 'no team'}", ExitCode.USAGE)


@sla_app.command("set", epilog=examples("kiln sla set default --max-queue-wait 300 --max-restarts 5"))
def sla_set(
    team: str,
    qos: Annotated[str | None, typer.Option("--qos", help="QoS class.")] = None,
    max_queue_wait: Annotated[float | None, typer.Option("--max-queue-wait", help="Seconds.")] = None,
    deadline: Annotated[str | None, typer.Option("--deadline", help="ISO-8601 UTC timestamp.")] = None,
    max_restarts: Annotated[int | None, typer.Option("--max-restarts")] = None,
    recovery_time_objective: Annotated[float | None, typer.Option("--recovery-time-objective", help="Seconds.")] = None,
    checkpoint_interval: Annotated[float | None, typer.Option("--checkpoint-interval", help="Seconds.")] = None,
    min_checkpoint_success_rate: Annotated[float | None, typer.Option("--min-checkpoint-success-rate")] = None,
    step_time_tolerance: Annotated[float | None, typer.Option("--step-time-tolerance")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Change a team's default SLA contract (fields not given stay as they are)."""
    fields = {
        "qos": qos,
        "max_queue_wait_s": max_queue_wait,
        "deadline": deadline,
        "max_restarts": max_restarts,
        "recovery_time_objective_s": recovery_time_objective,
        "checkpoint_interval_s": checkpoint_interval,
        "min_checkpoint_success_rate": min_checkpoint_success_rate,
        "step_time_tolerance": step_time_tolerance,
    }
    changes = {k: v for k, v in fields.items() if v is not None}
    if not changes:
        raise CliError("nothing to change: give at least one option (see kiln sla set --help)", ExitCode.USAGE)
    with client() as api:
        current = api.get(f"/v1/teams/{team}/sla")  # PUT replaces the contract: keep the terms not given
        from core.spec import SLAOverrides  # the contract's terms; imported here to keep `kiln` quick to start

        body = {k: current.get(k) for k in SLAOverrides.model_fields if current.get(k) is not None} | changes
        data = api.put(f"/v1/teams/{team}/sla", json=body)
    out.render(data, output, lambda: out.kv_table(flatten(data), title=f"SLA contract of team {team}"))


@app.command(epilog=examples("kiln usage", "kiln usage --team vision --since 2026-11-01"))
def usage(
    team: Annotated[str | None, typer.Option("--team", "-t", help="Only this team.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="ISO-8601 start (default: the budget period).")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """GPU-hours (and cost) per team against budget."""
    params = {k: v for k, v in (("team", team), ("since", since)) if v}
    with client() as api:
        data = api.get("/v1/usage", params=params)
    rows = data.get("teams", []) if isinstance(data, dict) else []
    title = None
    if isinstance(data, dict) and data.get("since"):
        title = f"GPU-hours from {out.fmt_time(data.get('since'))} to {out.fmt_time(data.get('until'))}"
    errors = data.get("forecasts") if isinstance(data, dict) else None
    out.render(data, output, lambda: _usage_tables(rows, errors or [], title))


def _usage_tables(rows: list[dict[str, Any]], errors: list[dict[str, Any]], title: str | None) -> Any:
    """The teams' GPU-hours; under them, how far kiln's forecasts for their jobs were from what happened."""
    teams = out.table(out.USAGE_COLUMNS, rows, title=title)
    if not errors:
        return teams
    said = "Forecasts against what happened (error = measured - forecast; a start's from its earliest)"
    return Group(teams, "", out.table(out.FORECAST_COLUMNS, errors, title=said))


def _sandbox_column(host: dict[str, Any]) -> str:
    mode = host.get("isolation") or "-"
    return f"{mode}: {host.get('isolation_note') or ''}"[:100] if mode == "unavailable" else mode


@app.command(epilog=examples("kiln hosts", "kiln hosts --gpus"))
def hosts(
    gpus: Annotated[bool, typer.Option("--gpus", help="List the GPUs instead of the hosts.")] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Hosts (state, slots, whether they sandbox teams' code, last heartbeat) or, with --gpus, their GPUs."""
    if gpus:
        columns: list[out.Column] = [
            ("HOST", lambda g: g.get("host")),
            ("INDEX", lambda g: g.get("index")),
            ("MODEL", lambda g: g.get("model")),
            ("MEMORY", lambda g: out.fmt_bytes(g.get("memory_bytes"))),
            ("HEALTHY", lambda g: g.get("healthy")),
            ("UUID", lambda g: g.get("uuid")),
        ]
    else:
        columns = [
            ("NAME", lambda h: h.get("name")),
            ("STATE", lambda h: h.get("state")),
            ("GPUS", lambda h: h.get("gpu_count")),
            ("CPU SLOTS", lambda h: h.get("cpu_slots")),
            ("MPS", lambda h: h.get("mps") or "-"),
            ("SANDBOX", _sandbox_column),
            ("HEARTBEAT", lambda h: out.fmt_age(h.get("last_heartbeat_at"))),
            ("EXCLUDED", lambda h: h.get("exclusion_reason") or ""),
        ]
    show_list("/v1/cluster/gpus" if gpus else "/v1/cluster/hosts", columns, output)
