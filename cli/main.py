"""The ``kiln`` command.

Every command that talks to the API goes through :class:`cli.client.KilnClient`, whose errors become one clear
line and a distinct exit code (see :class:`cli.errors.ExitCode`). Heavy modules (httpx, pydantic, SQLAlchemy,
the scheduler) are imported inside the commands that need them, so ``kiln --help`` stays fast; nothing here
imports torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click import Context as ClickContext
from typer.core import TyperGroup

from cli import output as out
from cli.errors import CliError, ExitCode
from cli.output import OutputFormat, console, err_console


class KilnGroup(TyperGroup):
    """Turn :class:`CliError` (and Ctrl-C) into a message on stderr and an exit code, never a traceback."""

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            report(exc)
            raise typer.Exit(int(exc.code)) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def report(exc: CliError) -> None:
    from rich.text import Text

    err_console.print(Text.assemble(("error:", "bold red"), " ", exc.message))  # messages are text, not markup
    for line in exc.details:
        err_console.print(f"  - {line}", markup=False, highlight=False)


app = typer.Typer(
    cls=KilnGroup,
    name="kiln",
    help="kiln: GPU training jobs under SLA contracts.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals may hold the API token
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
)
teams_app = typer.Typer(help="Teams, their quotas and members.", no_args_is_help=False)
tokens_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=False)
sla_app = typer.Typer(help="A team's default SLA contract.", no_args_is_help=False)
admin_app = typer.Typer(help="Operator commands that talk to the database directly.", no_args_is_help=True)
app.add_typer(teams_app, name="teams")
app.add_typer(tokens_app, name="tokens")
app.add_typer(sla_app, name="sla")
app.add_typer(admin_app, name="admin")


class _Globals:
    api_url: str | None = None
    token: str | None = None


GLOBALS = _Globals()

OutputOpt = Annotated[
    OutputFormat, typer.Option("--output", "-o", help="table for people, json for scripts.", case_sensitive=False)
]
JobArg = Annotated[int, typer.Argument(help="The job id.", min=1, show_default=False)]


@app.callback()
def main(
    api_url: Annotated[
        str | None, typer.Option("--api-url", help="API base URL (default: KILN_API_URL, then the config file).")
    ] = None,
    token: Annotated[str | None, typer.Option("--token", help="API token (default: KILN_TOKEN, then config).")] = None,
) -> None:
    GLOBALS.api_url = api_url
    GLOBALS.token = token


def client() -> Any:
    from cli.client import KilnClient
    from cli.config import ConfigError, resolve

    try:
        cfg = resolve(url_flag=GLOBALS.api_url, token_flag=GLOBALS.token)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    return KilnClient(cfg)


def _items(page: Any) -> list[dict[str, Any]]:
    if isinstance(page, dict) and "items" in page:
        return list(page["items"])
    return list(page or [])


# -- session ----------------------------------------------------------------------------------------------------


@app.command()
def login(
    url: Annotated[str | None, typer.Option("--url", help="API base URL.")] = None,
    token: Annotated[str | None, typer.Option("--token", help="API token (prompted for when absent).")] = None,
) -> None:
    """Save the API URL and token (verified against /v1/me) in ~/.config/kiln/config.json (mode 0600)."""
    from cli.client import KilnClient
    from cli.config import DEFAULT_API_URL, CliConfig, config_path, normalize_url, save

    url = normalize_url(url or GLOBALS.api_url or DEFAULT_API_URL)
    token = token or GLOBALS.token or typer.prompt("API token", hide_input=True)
    with KilnClient(CliConfig(url, token, "flag", "flag")) as api:
        me = api.get("/v1/me")
    path = save(url, token, config_path())
    name = me.get("name", "?") if isinstance(me, dict) else "?"
    console.print(f"logged in to {url} as [bold]{name}[/]; saved to {path}")


@app.command()
def logout() -> None:
    """Forget the saved token (the URL stays)."""
    from cli.config import DEFAULT_API_URL, config_path, load_file, save

    data = load_file()
    if not data.get("token"):
        console.print("not logged in")
        return
    save(str(data.get("api_url") or DEFAULT_API_URL), None)
    console.print(f"token removed from {config_path()}")


@app.command()
def whoami(output: OutputOpt = OutputFormat.table) -> None:
    """Who the token belongs to, and the teams and roles it can act in."""
    with client() as api:
        me = api.get("/v1/me")
    out.render(me, output, lambda: _me_table(me))


def _me_table(me: dict[str, Any]) -> Any:
    pairs: list[tuple[str, Any]] = [(k, v) for k, v in me.items() if not isinstance(v, list | dict)]
    for membership in me.get("memberships") or me.get("teams") or []:
        if isinstance(membership, dict):
            pairs.append(("team", f"{membership.get('team')} ({membership.get('role')})"))
    return out.kv_table(pairs)


# -- jobs -------------------------------------------------------------------------------------------------------


def read_spec_file(path: str) -> str:
    """Read a job spec and validate it locally (quick, precise errors; the server validates again)."""
    from core.spec import SpecError, parse_spec_text

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", ExitCode.USAGE) from None
    try:
        parse_spec_text(text)
    except SpecError as exc:
        details = [f"{e['loc']}: {e['msg']}" for e in exc.errors]
        what = "malformed YAML" if str(exc).startswith("malformed") else "invalid job spec"
        headline = str(exc) if what == "malformed YAML" else f"{what} ({len(details)} error(s))"
        raise CliError(f"{path}: {headline}", ExitCode.INVALID, details) from None
    return text


@app.command()
def submit(
    file: Annotated[str, typer.Argument(help="Job spec, YAML or JSON ('-' reads stdin).", metavar="FILE")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Show progress and live loss until the job ends.")
    ] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Submit a job and print its id. With --follow, exit 0 on SUCCEEDED and 1 on FAILED or CANCELLED."""
    text = read_spec_file(file)
    with client() as api:
        job = submit_text(api, text)
        if output is OutputFormat.json and not follow:
            out.print_json(job)
            return
        if output is OutputFormat.table:
            console.print(
                f"submitted job [bold]{job['id']}[/] ({job.get('name')}, team {job.get('team')}, "
                f"qos {job.get('qos')}) — {job.get('state')}"
            )
        if not follow:
            if output is OutputFormat.table and sys.stdout.isatty():
                console.print(f"follow it with: kiln logs -f {job['id']}   or   kiln describe {job['id']}")
            return
        final = _follow(api, job["id"])
    if output is OutputFormat.json:
        out.print_json(final)
    raise typer.Exit(int(_state_exit(final.get("state"))))


def submit_text(api: Any, text: str) -> dict[str, Any]:
    """POST the spec as YAML (a superset of JSON): the server parses exactly what the user wrote."""
    job: dict[str, Any] = api.post("/v1/jobs", content=text.encode(), headers={"Content-Type": "application/yaml"})
    return job


def _follow(api: Any, job_id: int) -> dict[str, Any]:
    from cli.follow import follow_job

    try:
        return follow_job(api, job_id, console if sys.stdout.isatty() else err_console)
    except KeyboardInterrupt:
        err_console.print(f"stopped following; job {job_id} keeps going (kiln cancel {job_id} stops it)")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def _state_exit(state: str | None) -> ExitCode:
    from cli.follow import exit_code_for_state

    return exit_code_for_state(state)


@app.command("ls")
def list_jobs(
    team: Annotated[str | None, typer.Option("--team", "-t", help="Only this team's jobs.")] = None,
    state: Annotated[
        list[str] | None, typer.Option("--state", "-s", help="Only these states (repeatable, or comma-separated).")
    ] = None,
    qos: Annotated[str | None, typer.Option("--qos", help="Only this QoS class.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Only jobs with this name.")] = None,
    active: Annotated[bool, typer.Option("--active", help="Only jobs that have not finished.")] = False,
    all_: Annotated[bool, typer.Option("--all", "-a", help="Every matching job (follows all pages).")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many jobs.")] = 20,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """List jobs, newest first."""
    states = [s.strip().upper() for chunk in state or [] for s in chunk.split(",") if s.strip()]
    if active:
        states += [s for s in ("QUEUED", "ADMITTED", "RUNNING", "PREEMPTING", "PAUSED", "LOST") if s not in states]
    params: dict[str, Any] = {"state": states} if states else {}
    for key, value in (("team", team), ("qos", qos), ("name", name)):
        if value:
            params[key] = value
    with client() as api:
        jobs = list(api.paginate("/v1/jobs", params, limit=None if all_ else limit))
    if output is OutputFormat.json:
        out.print_json(jobs)
    elif not jobs:
        err_console.print("no jobs")
    else:
        console.print(out.table(out.JOB_COLUMNS, jobs))


@app.command()
def describe(job_id: JobArg, output: OutputOpt = OutputFormat.table) -> None:
    """A job: its state, spec, SLA contract and standing, attempts and recent events."""
    with client() as api:
        job = api.get(f"/v1/jobs/{job_id}")
        sla = _optional(api, f"/v1/jobs/{job_id}/sla")
        attempts = _items(_optional(api, f"/v1/jobs/{job_id}/attempts"))
        checkpoints = _items(_optional(api, f"/v1/jobs/{job_id}/checkpoints"))
        events = job_events(api, job_id)
    data = {"job": job, "sla": sla, "attempts": attempts, "checkpoints": checkpoints, "events": events}
    if output is OutputFormat.json:
        out.print_json(data)
        return
    spec = job.get("spec") or {}
    resources = spec.get("resources") or {}
    res = f"{job.get('gpus')} GPU" + (f" ({job.get('gpu_type')})" if job.get("gpu_type") else "")
    if not job.get("gpus"):
        res = f"{resources.get('cpu_slots', 1)} CPU slot(s)"
    pairs: list[tuple[str, Any]] = [
        ("job", f"{job.get('id')}  {job.get('name')}"),
        ("team / user", f"{job.get('team')} / {job.get('user')}"),
        ("state", out.state_text(job.get("state"))),
        ("qos / priority", f"{job.get('qos')} / {job.get('priority')}"),
        ("resources", res),
        ("recipe", (spec.get("recipe") or {}).get("name")),
        ("progress", f"step {out.job_progress(job)}, loss {out.fmt_loss(job.get('last_loss'))}"),
        ("restarts", job.get("restart_count")),
        ("submitted", out.fmt_time(job.get("submitted_at"))),
        ("admitted", out.fmt_time(job.get("admitted_at"))),
        ("started", out.fmt_time(job.get("started_at"))),
        ("finished", out.fmt_time(job.get("finished_at"))),
    ]
    if job.get("pending_reason"):
        pairs.append(("waiting", f"{job['pending_reason']}: {job.get('pending_message') or ''}"))
    if job.get("exit_reason"):
        pairs.append(("exit reason", job["exit_reason"]))
    console.print(out.kv_table(pairs, title=f"Job {job_id}"))
    if isinstance(sla, dict):
        console.print()
        console.print(out.kv_table(_flatten(sla), title="SLA"))
    if attempts:
        console.print()
        console.print(out.table(out.ATTEMPT_COLUMNS, attempts, title="Attempts"))
    if checkpoints:
        console.print()
        console.print(out.table(out.CHECKPOINT_COLUMNS, checkpoints[-5:], title="Checkpoints (latest)"))
    if events:
        console.print()
        console.print(out.table(out.EVENT_COLUMNS, events[-15:], title="Recent events"))


def job_events(api: Any, job_id: int, *, limit: int | None = None) -> list[dict[str, Any]]:
    """A job's events, oldest first, following ``next_after`` (at most ``limit``, newest kept)."""
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = api.get(f"/v1/jobs/{job_id}/events", params={"after": after, "limit": 500})
        events.extend(_items(page))
        nxt = page.get("next_after") if isinstance(page, dict) else None
        if not nxt or nxt == after or not _items(page):
            break
        after = int(nxt)
    return events[-limit:] if limit else events


def _optional(api: Any, path: str) -> Any:
    """A sub-resource that may not exist for this job (404 -> None); other errors still stop the command."""
    try:
        return api.get(path)
    except CliError as exc:
        if exc.code is ExitCode.NOT_FOUND:
            return None
        raise


def _flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            pairs.extend(_flatten(value, f"{prefix}{key}."))
        else:
            pairs.append((f"{prefix}{key}", value))
    return pairs


@app.command()
def events(
    job_id: JobArg,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="The last this many events.")] = 200,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """A job's timeline: every state transition, restart, checkpoint and SLA event."""
    with client() as api:
        items = job_events(api, job_id, limit=limit)
    out.render(items, output, lambda: out.table(out.EVENT_COLUMNS, items))


@app.command()
def logs(
    job_id: JobArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends.")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", min=1, help="Default: the latest attempt.")] = None,
) -> None:
    """A job's training logs (server-sent events); -f follows them live until the job ends."""
    from cli.follow import END_EVENTS, log_line

    params: dict[str, Any] = {"follow": "true" if follow else "false"}
    if attempt is not None:
        params["attempt"] = attempt
    with client() as api:
        try:
            for event in api.stream_sse(f"/v1/jobs/{job_id}/logs", params=params):
                if event.event in END_EVENTS:
                    if _sse_json(event).get("attempt") is None:
                        err_console.print(f"no logs yet: job {job_id} has not started an attempt")
                    break
                if event.event == "attempt":
                    err_console.print(f"--- attempt {_sse_json(event).get('attempt')} ---")
                    continue
                line = log_line(event)
                if line is not None:
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
        except KeyboardInterrupt:
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def _sse_json(event: Any) -> dict[str, Any]:
    try:
        data = event.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


@app.command()
def cancel(
    job_id: JobArg,
    reason: Annotated[str | None, typer.Option("--reason", help="Recorded in the job's events.")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Cancel a job: a queued one at once; a running one is asked to stop (it checkpoints first)."""
    with client() as api:
        job = api.post(f"/v1/jobs/{job_id}/cancel", json={"reason": reason} if reason else None)
    if output is OutputFormat.json:
        out.print_json(job)
    else:
        console.print(f"job {job_id}: {job.get('state') if isinstance(job, dict) else 'cancel requested'}")


@app.command()
def why(job_id: JobArg, output: OutputOpt = OutputFormat.table) -> None:
    """Why a job is waiting (or where it stands): the scheduler's pending reason and what would unblock it."""
    with client() as api:
        data = api.get(f"/v1/jobs/{job_id}/why")
    if output is OutputFormat.json:
        out.print_json(data)
        return
    if isinstance(data, dict):
        head = data.get("summary") or data.get("message") or data.get("pending_message")
        reason = data.get("reason") or data.get("pending_reason")
        if reason:
            console.print(f"[bold]{reason}[/]" + (f": {head}" if head else ""))
        elif head:
            console.print(head)
        rest = [
            (k, v)
            for k, v in _flatten(data)
            if k not in {"summary", "message", "reason", "pending_reason", "pending_message"}
        ]
        if rest:
            console.print(out.kv_table(rest))
    else:
        console.print(str(data))


@app.command()
def metrics(
    job_id: JobArg,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="The last this many points.")] = 20,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """A job's training metrics (step, loss, throughput...)."""
    with client() as api:
        points = _items(api.get(f"/v1/jobs/{job_id}/metrics"))[-limit:]
    out.render(points, output, lambda: out.table(out.METRIC_COLUMNS, points))


# -- teams, QoS, SLA, usage, cluster ----------------------------------------------------------------------------


@teams_app.callback(invoke_without_command=True)
def teams(ctx: typer.Context, output: OutputOpt = OutputFormat.table) -> None:
    """List the teams you can see (subcommands: show, create, members, add-member, remove-member)."""
    if ctx.invoked_subcommand is not None:
        return
    with client() as api:
        items = _items(api.get("/v1/teams"))
    out.render(items, output, lambda: out.table(out.TEAM_COLUMNS, items))


@teams_app.command("show")
def teams_show(team: str, output: OutputOpt = OutputFormat.table) -> None:
    """A team: quotas, budget, fair-share weight."""
    with client() as api:
        data = api.get(f"/v1/teams/{team}")
    out.render(data, output, lambda: out.kv_table(_flatten_lists(data), title=f"Team {team}"))


def _flatten_lists(data: dict[str, Any]) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for key, value in _flatten(data):
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


@teams_app.command("create")
def teams_create(
    name: str,
    quota: Annotated[
        list[str] | None, typer.Option("--quota", help="TYPE=N[:borrow=N][:lend=N], repeatable (cpu=4, H200=8).")
    ] = None,
    cohort: Annotated[str | None, typer.Option(help="Cohort whose teams lend to each other.")] = None,
    gpu_hour_budget: Annotated[float | None, typer.Option(help="GPU-hours per budget period.")] = None,
    fair_share_weight: Annotated[float | None, typer.Option(help="Weight in fair share.")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Create a team (admin)."""
    body: dict[str, Any] = {"name": name, "quotas": [_parse_quota(q) for q in quota or []]}
    for key, value in (
        ("cohort", cohort),
        ("gpu_hour_budget", gpu_hour_budget),
        ("fair_share_weight", fair_share_weight),
    ):
        if value is not None:
            body[key] = value
    with client() as api:
        data = api.post("/v1/teams", json=body)
    out.render(data, output, lambda: f"team {data.get('name', name)} created")


@teams_app.command("members")
def teams_members(team: str, output: OutputOpt = OutputFormat.table) -> None:
    """A team's members and their roles."""
    with client() as api:
        data = api.get(f"/v1/teams/{team}/members")
    items = _items(data)
    columns: list[out.Column] = [
        ("USER", lambda m: m.get("user")),
        ("ROLE", lambda m: m.get("role")),
        ("SINCE", lambda m: out.fmt_time(m.get("created_at"))),
    ]
    out.render(items, output, lambda: out.table(columns, items))


@teams_app.command("add-member")
def teams_add_member(
    team: str,
    user: str,
    role: Annotated[str, typer.Option(help="team-admin, member or viewer.")] = "member",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Add a user to a team (or change their role); the user is created if new."""
    with client() as api:
        data = api.put(f"/v1/teams/{team}/members/{user}", json={"role": role})
    out.render(data, output, lambda: f"{user} is {role} in {team}")


@teams_app.command("remove-member")
def teams_remove_member(team: str, user: str) -> None:
    """Remove a user from a team."""
    with client() as api:
        api.delete(f"/v1/teams/{team}/members/{user}")
    console.print(f"{user} removed from {team}")


@app.command()
def qos(output: OutputOpt = OutputFormat.table) -> None:
    """QoS classes: priority, preemption, GPU memory and SM caps, bandwidth quotas."""
    with client() as api:
        items = _items(api.get("/v1/qos"))
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
    out.render(items, output, lambda: out.table(columns, items))


@sla_app.callback(invoke_without_command=True)
def sla(ctx: typer.Context, output: OutputOpt = OutputFormat.table) -> None:
    """Show your team's default SLA contract (subcommands: show TEAM, set TEAM ...)."""
    if ctx.invoked_subcommand is None:
        sla_show(None, output)


@sla_app.command("show")
def sla_show(
    team: Annotated[str | None, typer.Argument(help="The team (default: your only team).")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Show a team's default SLA contract."""
    with client() as api:
        team = team or _default_team(api)
        data = api.get(f"/v1/teams/{team}/sla")
    out.render(data, output, lambda: out.kv_table(_flatten(data), title=f"SLA contract of team {team}"))


def _default_team(api: Any) -> str:
    me = api.get("/v1/me")
    names = [m.get("team") for m in (me.get("memberships") or me.get("teams") or []) if isinstance(m, dict)]
    if len(names) == 1 and names[0]:
        return str(names[0])
    raise CliError(f"say which team: you belong to {', '.join(map(str, names)) or 'no team'}", ExitCode.USAGE)


@sla_app.command("set")
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
    out.render(data, output, lambda: out.kv_table(_flatten(data), title=f"SLA contract of team {team}"))


@app.command()
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
    out.render(data, output, lambda: out.table(out.USAGE_COLUMNS, rows, title=title))


@app.command()
def hosts(
    gpus: Annotated[bool, typer.Option("--gpus", help="List the GPUs instead of the hosts.")] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Hosts (state, slots, last heartbeat) or, with --gpus, their GPUs."""
    with client() as api:
        items = _items(api.get("/v1/cluster/gpus" if gpus else "/v1/cluster/hosts"))
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
            ("HEARTBEAT", lambda h: out.fmt_age(h.get("last_heartbeat_at"))),
            ("EXCLUDED", lambda h: h.get("exclusion_reason") or ""),
        ]
    out.render(items, output, lambda: out.table(columns, items))


# -- tokens -----------------------------------------------------------------------------------------------------


@tokens_app.callback(invoke_without_command=True)
def tokens(ctx: typer.Context, output: OutputOpt = OutputFormat.table) -> None:
    """Your API tokens (subcommands: create, revoke)."""
    if ctx.invoked_subcommand is not None:
        return
    with client() as api:
        items = _items(api.get("/v1/tokens"))
    columns: list[out.Column] = [
        ("ID", lambda t: t.get("id")),
        ("NAME", lambda t: t.get("name")),
        ("PREFIX", lambda t: t.get("prefix")),
        ("SCOPES", lambda t: ",".join(t.get("scopes") or [])),
        ("CREATED", lambda t: out.fmt_time(t.get("created_at"))),
        ("EXPIRES", lambda t: out.fmt_time(t.get("expires_at"))),
        ("LAST USED", lambda t: out.fmt_age(t.get("last_used_at"))),
        ("REVOKED", lambda t: out.fmt_time(t.get("revoked_at")) if t.get("revoked_at") else ""),
    ]
    out.render(items, output, lambda: out.table(columns, items))


@tokens_app.command("create")
def tokens_create(
    name: str,
    scope: Annotated[list[str] | None, typer.Option("--scope", help="read, write, admin (repeatable).")] = None,
    expires_in: Annotated[float | None, typer.Option("--expires-in", help="Lifetime in days.")] = None,
    user: Annotated[str | None, typer.Option("--user", help="Create it for another user (admin).")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Create a token; the secret is shown once."""
    body: dict[str, Any] = {"name": name}
    if scope:
        body["scopes"] = scope
    if expires_in is not None:
        body["expires_in_s"] = int(expires_in * 86400)
    if user:
        body["user"] = user
    with client() as api:
        data = api.post("/v1/tokens", json=body)
    if output is OutputFormat.json:
        out.print_json(data)
        return
    console.print(f"token {data.get('id')} ({name}) created; the secret is shown only this once:")
    console.print(data.get("secret"), markup=False)


@tokens_app.command("revoke")
def tokens_revoke(token_id: int) -> None:
    """Revoke a token by id."""
    with client() as api:
        api.delete(f"/v1/tokens/{token_id}")
    console.print(f"token {token_id} revoked")


# -- operator commands ------------------------------------------------------------------------------------------


DatabaseOpt = Annotated[
    str | None, typer.Option("--database-url", help="Default: KILN_DATABASE_URL, else the SQLite file in KILN_HOME.")
]


def _database_url(flag: str | None) -> str:
    from core.settings import Settings

    return flag or Settings().resolved_database_url


@admin_app.command("bootstrap")
def admin_bootstrap(
    name: Annotated[str, typer.Option("--name", help="The first admin's user name.")] = "admin",
    database_url: DatabaseOpt = None,
    save_config: Annotated[
        bool, typer.Option("--save/--no-save", help="Save the token in the CLI config for this API URL.")
    ] = False,
) -> None:
    """Create the first admin, the `default` team and a token (printed once). Talks to the database directly."""
    from cli.bootstrap import BootstrapError, bootstrap

    url = _database_url(database_url)
    try:
        result = bootstrap(url, name=name)
    except BootstrapError as exc:
        raise CliError(str(exc), ExitCode.CONFLICT if exc.conflict else ExitCode.FAILURE) from None
    console.print(f"created admin '{result.user}' and team 'default'; the admin token is shown only this once:")
    console.print(result.token, markup=False)
    if save_config:
        from cli.config import resolve, save

        path = save(resolve(url_flag=GLOBALS.api_url).api_url, result.token)
        console.print(f"saved to {path}")


@app.command()
def migrate(database_url: DatabaseOpt = None) -> None:
    """Upgrade the database schema to the newest migration."""
    from core.migrate import upgrade

    url = _database_url(database_url)
    upgrade(url)
    console.print(f"database at {_mask(url)} is at the newest migration")


def _mask(url: str) -> str:
    """Hide a password in a URL."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def simulate(ctx: typer.Context) -> None:
    """Replay a trace through the very policy the live scheduler runs: kiln simulate TRACE [--hosts N ...]
    (`kiln simulate --help` lists the simulator's options)."""
    try:
        from scheduler.simulate import main as simulate_main
    except ImportError as exc:
        raise CliError(f"the simulator is not available: {exc}") from None
    try:
        code = simulate_main(list(ctx.args))
    except SystemExit as exc:  # argparse: --help (0) or bad arguments (2)
        code = exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    raise typer.Exit(int(code))


@app.command()
def up(
    port: Annotated[int, typer.Option("--port", help="API port.")] = 8421,
    host: Annotated[str, typer.Option("--host", help="API bind address.")] = "127.0.0.1",
    cpu_slots: Annotated[int, typer.Option("--cpu-slots", min=1, help="Training processes of the local worker.")] = 2,
    worker: Annotated[bool, typer.Option("--worker/--no-worker", help="Start a local worker.")] = True,
    submit_file: Annotated[
        str | None, typer.Option("--submit", help="Submit this job spec once kiln is ready.", metavar="FILE")
    ] = None,
    grace: Annotated[float, typer.Option("--grace", help="Seconds children get to stop before SIGKILL.")] = 30.0,
) -> None:
    """Bring kiln up: migrate, bootstrap on first run, then run and supervise the API, scheduler and a worker."""
    from cli.up import UpOptions, run_up

    raise typer.Exit(
        run_up(
            UpOptions(host=host, port=port, cpu_slots=cpu_slots, worker=worker, submit_file=submit_file, grace_s=grace)
        )
    )


if __name__ == "__main__":  # pragma: no cover
    app()
