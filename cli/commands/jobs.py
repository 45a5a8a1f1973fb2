"""Job commands: ``kiln submit``, ``ls``, ``describe``, ``events``, ``logs``, ``cancel``, ``why``, ``metrics``."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.text import Text

from cli import output as out
from cli.app import OutputOpt, app, cli_name, client, examples, flatten, page_items
from cli.errors import CliError, ExitCode
from cli.output import OutputFormat, console, err_console
from core.states import TERMINAL, JobState

JobArg = Annotated[int, typer.Argument(help="The job id.", min=1, show_default=False)]


def read_text(path: str) -> str:
    """A file's text ('-': stdin), or a usage error naming it."""
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", ExitCode.USAGE) from None


def spec_errors(where: str, what: str, errors: list[dict[str, Any]], headline: str | None = None) -> CliError:
    """A spec's errors as the CLI says them: ``where: what (N error(s))`` (or ``headline``), then a line per field."""
    details = [f"{e['loc']}: {e['msg']}" for e in errors]
    return CliError(f"{where}: {headline or f'{what} ({len(details)} error(s))'}", ExitCode.INVALID, details)


def read_spec_file(path: str) -> str:
    """Read a job spec and validate it locally (quick, precise errors; the server validates again)."""
    from core.spec import SpecError, parse_spec_text

    text = read_text(path)
    try:
        parse_spec_text(text)
    except SpecError as exc:
        malformed = str(exc).startswith("malformed")
        raise spec_errors(path, "invalid job spec", exc.errors, str(exc) if malformed else None) from None
    return text


WorkdirOpt = Annotated[
    Path | None,
    typer.Option(
        "--workdir",
        "-w",
        help="Your code: packed (.gitignore/.kilnignore honoured), uploaded once by its SHA-256, named in the "
        "spec's code.digest.",
        file_okay=False,
        exists=True,
    ),
]

CheckOpt = Annotated[
    bool | None,
    typer.Option(
        "--check/--no-check",
        help="Before uploading: validate the spec and hyperparameters and run one forward/backward step of the "
        "model (a sweep's: its first job's) on the CPU (needs torch); submit only if it passes. By default, with "
        "--workdir and torch here, the code's own hyperparameters are read (every job's of a sweep; no model "
        "step); --no-check: neither.",
        show_default=False,
    ),
]


def local_check(specs: list[dict[str, Any]], workdir: Path | None, check: bool | None) -> None:
    """``--check`` runs the (first) job's model one step; by default the team's own code's hyperparameters are read
    wherever this client can, every job's of a sweep (a mistake in them is refused here, not later by the job);
    ``--no-check`` skips both."""
    from cli import code as user_code

    if check is True and specs:
        user_code.check(specs, workdir)
    elif check is None and workdir is not None and specs and user_code.can_check(specs[0]):
        user_code.check(specs, workdir, run_model=False)


@app.command(
    epilog=examples(
        "kiln submit examples/gpt-tiny.yaml --follow",
        "kiln submit examples/digits/job.yaml --workdir examples/digits",
        "kiln submit job.yaml --hold -o json",
    )
)
def submit(
    file: Annotated[str, typer.Argument(help="Job spec, YAML or JSON ('-' reads stdin).", metavar="FILE")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Show progress and live loss until the job ends.")
    ] = False,
    workdir: WorkdirOpt = None,
    check: CheckOpt = None,
    hold: Annotated[bool, typer.Option("--hold", help="Submit it held: it does not start until kiln release.")] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Submit a job and print its id. With --follow, exit 0 on SUCCEEDED and 1 on FAILED or CANCELLED."""
    from cli import code as user_code

    text = read_spec_file(file)
    data = user_code.with_code(text, file) if workdir is not None else None
    local_check([data if data is not None else yaml.safe_load(text)], workdir, check)
    with client() as api:
        if workdir is not None and data is not None:
            user_code.upload(api, data, workdir)
            job = api.post("/v1/jobs", json=data, params={"hold": "true"} if hold else None)
        else:
            job = submit_text(api, text, hold=hold)
        report_submitted(api, job, follow=follow, output=output)


def report_submitted(api: Any, job: dict[str, Any], *, follow: bool, output: OutputFormat) -> None:
    """Say what was submitted; with ``follow``, follow it to its end and exit with its outcome."""
    if output is not OutputFormat.table and not follow:
        out.print_data(job, output)
        return
    if output is OutputFormat.table:
        console.print(
            out.text(
                f"submitted job {job['id']} ({job.get('name')}, team {job.get('team')}, "
                f"qos {job.get('qos')}) — {job.get('state')}"
            )
        )
        if job.get("pending_message") and not job.get("held_at"):  # accepted beyond what the hosts could hold
            err_console.print(out.text(f"warning: {job['pending_message']}"))  # (an operator's choice, or none yet)
    if not follow:
        if output is OutputFormat.table and sys.stdout.isatty():
            console.print(f"follow it with: {cli_name()} logs -f {job['id']}   or   {cli_name()} describe {job['id']}")
        return
    final = _follow(api, job["id"])
    if output is not OutputFormat.table:
        out.print_data(final, output)
    raise typer.Exit(int(_state_exit(final.get("state"))))


_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str, *, now: datetime | None = None) -> str:
    """``--since`` / ``--until``: a time ago (``90m``, ``2h``, ``3d``, ``1w``) or an ISO 8601 date or time (no zone:
    UTC), as the RFC 3339 UTC time the API takes."""
    text = text.strip()
    if m := _DURATION.match(text):
        when = (now or datetime.now(UTC)) - timedelta(seconds=int(m[1]) * _UNIT_S[m[2]])
    else:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise typer.BadParameter(
                f"{text!r} is neither a time ago (30m, 2h, 3d, 1w) nor an ISO date or time (2026-11-03, "
                "2026-11-03T14:00, 2026-11-03T14:00+01:00)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_duration(text: str) -> float | None:
    """``--time-limit``: seconds (``7200``), a duration (``90m``, ``2h``, ``1d``) or ``none`` (no limit)."""
    text = text.strip().lower()
    if text == "none":
        return None
    if m := _DURATION.match(text):
        return float(int(m[1]) * _UNIT_S[m[2]])
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a duration: seconds (7200), 90m, 2h, 1d, or none") from None


def job_filter(
    api: Any,
    *,
    team: str | None = None,
    state: list[str] | None = None,
    qos: str | None = None,
    name: str | None = None,
    user: str | None = None,
    mine: bool = False,
    active: bool = False,
    since: str | None = None,
    until: str | None = None,
    held: bool | None = None,
    sweep: int | None = None,
) -> dict[str, Any]:
    """The query of ``GET /v1/jobs`` for the CLI's filter options (``--mine``: the token's own user)."""
    states = [s.strip().upper() for chunk in state or [] for s in chunk.split(",") if s.strip()]
    if active:
        states += [s.value for s in JobState if s not in TERMINAL and s.value not in states]
    if mine:
        user = api.get("/v1/me")["name"]
    params: dict[str, Any] = {"state": states} if states else {}
    for key, value in (("team", team), ("qos", qos), ("name", name), ("user", user)):
        if value:
            params[key] = value
    if since:
        params["submitted_after"] = parse_when(since)
    if until:
        params["submitted_before"] = parse_when(until)
    if held is not None:
        params["held"] = "true" if held else "false"
    if sweep is not None:
        params["sweep"] = sweep
    return params


def submit_text(api: Any, text: str, *, hold: bool = False) -> dict[str, Any]:
    """POST the spec as YAML (a superset of JSON): the server parses exactly what the user wrote."""
    job: dict[str, Any] = api.post(
        "/v1/jobs",
        content=text.encode(),
        headers={"Content-Type": "application/yaml"},
        params={"hold": "true"} if hold else None,
    )
    return job


def _follow(api: Any, job_id: int) -> dict[str, Any]:
    from cli.follow import follow_job

    try:
        return follow_job(api, job_id, console if sys.stdout.isatty() else err_console)
    except KeyboardInterrupt:
        err_console.print(f"stopped following; job {job_id} keeps going ({cli_name()} cancel {job_id} stops it)")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def _state_exit(state: str | None) -> ExitCode:
    from cli.follow import exit_code_for_state

    return exit_code_for_state(state)


@app.command(
    "ls",
    epilog=examples(
        "kiln ls --mine --active", "kiln ls -t vision -s FAILED --since 1d", "kiln ls --held", "kiln ls --sweep 3"
    ),
)
def list_jobs(
    team: Annotated[str | None, typer.Option("--team", "-t", help="Only this team's jobs.")] = None,
    state: Annotated[
        list[str] | None, typer.Option("--state", "-s", help="Only these states (repeatable, or comma-separated).")
    ] = None,
    qos: Annotated[str | None, typer.Option("--qos", help="Only this QoS class.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Only jobs with this name.")] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only jobs this user submitted.")] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only jobs you submitted.")] = False,
    active: Annotated[bool, typer.Option("--active", help="Only jobs that have not finished.")] = False,
    held: Annotated[bool, typer.Option("--held", help="Only held jobs (kiln hold).")] = False,
    since: Annotated[
        str | None, typer.Option("--since", help="Only jobs submitted since: 2h, 3d, 1w ago, or an ISO date or time.")
    ] = None,
    until: Annotated[str | None, typer.Option("--until", help="Only jobs submitted before (as --since).")] = None,
    sweep: Annotated[int | None, typer.Option("--sweep", help="Only this sweep's jobs.")] = None,
    all_: Annotated[bool, typer.Option("--all", "-a", help="Every matching job (follows all pages).")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many jobs.")] = 20,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """List jobs, newest first."""
    with client() as api:
        params = job_filter(
            api,
            team=team,
            state=state,
            qos=qos,
            name=name,
            user=user,
            mine=mine,
            active=active,
            since=since,
            until=until,
            held=True if held else None,
            sweep=sweep,
        )
        jobs = list(api.paginate("/v1/jobs", params, limit=None if all_ else limit))
    if output is not OutputFormat.table:
        out.print_data(jobs, output)
    elif not jobs:
        err_console.print("no jobs")
    else:
        console.print(out.table(out.JOB_COLUMNS, jobs))


@app.command(epilog=examples("kiln describe 7", "kiln describe 7 -o json"))
def describe(job_id: JobArg, output: OutputOpt = OutputFormat.table) -> None:
    """A job: its state, spec, SLA contract and standing, attempts and recent events."""
    with client() as api:
        job = api.get(f"/v1/jobs/{job_id}")
        sla = _optional(api, f"/v1/jobs/{job_id}/sla")
        attempts = _optional_pages(api, f"/v1/jobs/{job_id}/attempts")
        checkpoints = _optional_pages(api, f"/v1/jobs/{job_id}/checkpoints")
        events = job_events(api, job_id)
        code = _optional(api, f"/v1/jobs/{job_id}/code") if (job.get("spec") or {}).get("code") else None
        why = _optional(api, f"/v1/jobs/{job_id}/why") if job.get("state") == "QUEUED" else None
        base = str(api.base_url)
    data = {
        "job": job,
        "sla": sla,
        "attempts": attempts,
        "checkpoints": checkpoints,
        "events": events,
        "code": code,
        "why": why,
    }
    if output is not OutputFormat.table:
        out.print_data(data, output)
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
        ("recipe", (spec.get("recipe") or {}).get("name"))
        if spec.get("recipe") is not None
        else ("command", " ".join(str(a) for a in spec.get("command") or [])),
        ("progress", f"step {out.job_progress(job)}, loss {out.fmt_loss(job.get('last_loss'))}"),
        ("restarts", job.get("restart_count")),
        ("queued", out.job_queued(job)),
        ("submitted", out.fmt_time(job.get("submitted_at"))),
        ("admitted", out.fmt_time(job.get("admitted_at"))),
        ("started", out.fmt_time(job.get("started_at"))),
        ("finished", out.fmt_time(job.get("finished_at"))),
    ]
    if job.get("held_at") and job.get("state") != "QUEUED":
        pairs.append(
            ("hold", f"{job.get('pending_message') or 'held'}: stopping, checkpoint first, then back in the queue held")
        )
    elif job.get("pending_reason"):
        pairs.append(("waiting", f"{job['pending_reason']}: {job.get('pending_message') or ''}"))
    if isinstance(why, dict) and (start := out.expected_start(why)):  # kiln why's answer, from the same endpoint
        pairs.append(("expected start", start))
    if isinstance(job.get("checkpoint_advice"), dict):  # Young/Daly from the job's saves and its GPU type's failures
        pairs.append(("checkpointing", job["checkpoint_advice"]["summary"]))
    for f in job.get("forecasts") or []:  # what kiln forecast, against what happened (kiln usage sums them up)
        pairs.append((f"forecast: {out.forecast_kind(f.get('kind'))}", out.fmt_forecast(f)))
    if job.get("exit_reason"):
        pairs.append(("exit reason", job["exit_reason"]))
    if isinstance(code, dict):
        pairs += _code_pairs(base, code)
    if spec.get("datasets"):
        pairs.append(("datasets", ", ".join(str(n) for n in spec["datasets"]) + " (read-only)"))
    console.print(out.kv_table(pairs, title=f"Job {job_id}"))
    if isinstance(sla, dict):
        console.print()
        console.print(out.kv_table(flatten(sla), title="SLA"))
    if attempts:
        console.print()
        console.print(out.table(out.ATTEMPT_COLUMNS, attempts, title="Attempts"))
        for a in attempts:  # the compile cache's reuse, one line per attempt: hit/miss, source, key, time saved
            if isinstance(a.get("compile"), dict):
                console.print(f"attempt {a.get('number')}  compile: {a['compile'].get('summary')}", highlight=False)
    if checkpoints:
        console.print()
        console.print(out.table(out.CHECKPOINT_COLUMNS, checkpoints[-5:], title="Checkpoints (latest)"))
    if events:
        console.print()
        console.print(out.table(out.EVENT_COLUMNS, events[-15:], title="Recent events"))


def _code_pairs(base: str, code: dict[str, Any]) -> list[tuple[str, Any]]:
    """The team's own code: digest, entry point, where to download it, and its last evaluation."""
    pairs: list[tuple[str, Any]] = [("code", f"sha256:{code.get('digest')}")]
    if code.get("entry_point"):  # a script (command:) has none
        pairs.append(("entry point", code.get("entry_point")))
    if code.get("download"):
        pairs.append(("download", f"{base.rstrip('/')}{code['download']}"))
    evaluation = code.get("evaluation")
    if isinstance(evaluation, dict):
        metrics = evaluation.get("metrics") or {}
        shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, (int, float)) else f"{k} -" for k, v in metrics.items())
        pairs.append(("evaluation", f"step {evaluation.get('step')}: {shown}"))
    return pairs


def job_events(api: Any, job_id: int, *, limit: int | None = None) -> list[dict[str, Any]]:
    """A job's events, oldest first, following ``next_after`` (at most ``limit``, newest kept)."""
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = api.get(f"/v1/jobs/{job_id}/events", params={"after": after, "limit": 500})
        events.extend(page_items(page))
        nxt = page.get("next_after") if isinstance(page, dict) else None
        if not nxt or nxt == after or not page_items(page):
            break
        after = int(nxt)
    return events[-limit:] if limit else events


def _optional_pages(api: Any, path: str) -> list[dict[str, Any]]:
    """Every item of a job's sub-list, page after page ([] if the job has none: 404)."""
    try:
        return list(api.paginate(path, {}, limit=None, page_size=500))
    except CliError as exc:
        if exc.code is ExitCode.NOT_FOUND:
            return []
        raise


def _optional(api: Any, path: str) -> Any:
    """A sub-resource that may not exist for this job (404 -> None); other errors still stop the command."""
    try:
        return api.get(path)
    except CliError as exc:
        if exc.code is ExitCode.NOT_FOUND:
            return None
        raise


@app.command(epilog=examples("kiln events 7 -n 50"))
def events(
    job_id: JobArg,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="The last this many events.")] = 200,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """A job's timeline: every state transition, restart, checkpoint and SLA event."""
    with client() as api:
        items = job_events(api, job_id, limit=limit)
    out.render(items, output, lambda: out.table(out.EVENT_COLUMNS, items))


@app.command(epilog=examples("kiln logs 7", "kiln logs -f --tail 20 7", "kiln logs --attempt 1 7"))
def logs(
    job_id: JobArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends.")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", min=1, help="Default: the latest attempt.")] = None,
    tail: Annotated[int | None, typer.Option("--tail", "-n", min=0, help="Begin with the last N lines.")] = None,
) -> None:
    """A job's training logs (server-sent events); -f follows them live until the job ends."""
    from cli.follow import END_EVENTS, log_line

    params: dict[str, Any] = {"follow": "true" if follow else "false"}
    if attempt is not None:
        params["attempt"] = attempt
    if tail is not None:
        params["tail"] = tail
    tty = sys.stdout.isatty()
    with client() as api:
        try:
            for event in api.stream_sse(f"/v1/jobs/{job_id}/logs", params=params):
                if event.event in END_EVENTS:
                    end = _sse_json(event)
                    if end.get("reason") == "unauthorized":
                        raise CliError(
                            "the stream was closed: this token was revoked or expired, or you are no "
                            "longer in the job's team",
                            ExitCode.UNAUTHORIZED,
                        )
                    if end.get("attempt") is None:
                        err_console.print(f"no logs yet: job {job_id} has not started an attempt")
                    break
                if event.event == "attempt":
                    err_console.print(out.text(f"--- attempt {_sse_json(event).get('attempt')} ---"))
                    continue
                line = log_line(event)
                if line is not None:  # as written; on a terminal, with control characters made visible
                    sys.stdout.write((out.safe(line) if tty else line) + "\n")
                    sys.stdout.flush()
        except KeyboardInterrupt:
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def _sse_json(event: Any) -> dict[str, Any]:
    try:
        data = event.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# The options that pick jobs for cancel, hold and release, when no ids are given.
TeamSel = Annotated[str | None, typer.Option("--team", "-t", help="Every matching job of this team...")]
NameSel = Annotated[str | None, typer.Option("--name", help="...with this name.")]
StateSel = Annotated[list[str] | None, typer.Option("--state", "-s", help="...in these states.")]
MineSel = Annotated[bool, typer.Option("--mine", help="...that you submitted.")]
SinceSel = Annotated[str | None, typer.Option("--since", help="...submitted since (2h, 3d, or an ISO time).")]
UntilSel = Annotated[str | None, typer.Option("--until", help="...submitted before (as --since).")]
SweepSel = Annotated[int | None, typer.Option("--sweep", help="...of this sweep.")]
JobIds = Annotated[list[int] | None, typer.Argument(help="Job ids.", min=1, show_default=False)]


def selected_ids(
    api: Any,
    job_ids: list[int] | None,
    *,
    team: str | None,
    name: str | None,
    state: list[str] | None,
    mine: bool,
    since: str | None,
    until: str | None,
    sweep: int | None = None,
    default_states: list[str] | None = None,
    held: bool | None = None,
    none: str = "no active job matches",
) -> list[int]:
    """The ids given, or the jobs the filter options match (``default_states`` when no --state; None: the active
    ones); ``held``: only held jobs, or none. Empty when nothing matches (``none`` said on stderr)."""
    if job_ids:
        return list(job_ids)
    if not any((team, name, state, mine, since, until, sweep is not None)):
        raise CliError(
            "give job ids, or a filter (--team, --name, --state, --mine, --since, --until, --sweep)", ExitCode.USAGE
        )
    params = job_filter(
        api,
        team=team,
        name=name,
        state=state or default_states,
        mine=mine,
        active=not (state or default_states),
        since=since,
        until=until,
        held=held,
        sweep=sweep,
    )
    ids = [int(j["id"]) for j in api.paginate("/v1/jobs", params, limit=None)]
    if not ids:
        err_console.print(none)
    return ids


def queued_ids(api: Any, job_ids: list[int] | None, *, held: bool, **filters: Any) -> list[int]:
    """The ids given, or the queued jobs the filter options match that are held (``held``) or not."""
    return selected_ids(
        api,
        job_ids,
        state=None,
        default_states=["QUEUED"],
        held=held,
        **filters,
        none="no held job matches" if held else "no queued job matches",
    )


def act_on_each(api: Any, ids: list[int], action: Any, output: OutputFormat) -> None:
    """Run ``action(api, job_id, say)`` on each job; with several, an error is reported and the others go ahead,
    and the command exits with the first error's code. Prints the answers with -o json/yaml."""
    say = console if output is OutputFormat.table else err_console  # stdout stays the data with -o json/yaml
    results = []
    for job_id in ids:
        try:
            results.append(action(api, job_id, say))
        except CliError as exc:
            if len(ids) == 1:
                raise
            err_console.print(out.text(f"job {job_id}: {exc.message}"))
            results.append({"id": job_id, "error": exc.message, "exit_code": int(exc.code)})
    if output is not OutputFormat.table and results:
        out.print_data(results[0] if len(ids) == 1 else results, output)
    codes = [r["exit_code"] for r in results if "exit_code" in r]
    if codes:
        raise typer.Exit(codes[0])


@app.command(
    epilog=examples(
        "kiln cancel 7",
        "kiln cancel 7 8 9 --reason 'wrong lr'",
        "kiln cancel --mine --since 30m",
        "kiln cancel --sweep 3",
    )
)
def cancel(
    job_ids: JobIds = None,
    team: TeamSel = None,
    name: NameSel = None,
    state: StateSel = None,
    mine: MineSel = False,
    since: SinceSel = None,
    until: UntilSel = None,
    sweep: SweepSel = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Recorded in the job's events.")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Cancel jobs: a queued one at once; a running one is asked to stop (it checkpoints first).

    Give job ids, or a filter over the active jobs you can see."""

    def one(api: Any, job_id: int, say: Any) -> dict[str, Any]:
        job: dict[str, Any] = api.post(f"/v1/jobs/{job_id}/cancel", json={"reason": reason} if reason else None)
        say.print(out.text(done_said("cancel", job_id, job.get("state"))))
        return job

    with client() as api:
        if (whole := whole_sweep(sweep, job_ids, team, name, state, mine, since, until)) is not None:
            act_on_sweep(api, whole, "cancel", {"reason": reason} if reason else None, output)
            return
        ids = selected_ids(
            api, job_ids, team=team, name=name, state=state, mine=mine, since=since, until=until, sweep=sweep
        )
        act_on_each(api, ids, one, output)


@app.command(epilog=examples("kiln hold 7", "kiln hold --mine --reason 'dataset not ready'", "kiln hold --sweep 3"))
def hold(
    job_ids: JobIds = None,
    team: TeamSel = None,
    name: NameSel = None,
    mine: MineSel = False,
    since: SinceSel = None,
    until: UntilSel = None,
    sweep: SweepSel = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Shown as the pending message.")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Hold jobs: they do not start until released (kiln release). Their wait pauses meanwhile: the queue-wait
    SLA counts no held time. A running job stops, checkpoint first, and waits in the queue held.

    Give job ids, or a filter over the queued jobs you can see (running ones only by id); kiln submit --hold
    submits a job held."""

    filters = {"team": team, "name": name, "mine": mine, "since": since, "until": until, "sweep": sweep}
    hold_or_release(job_ids, hold=True, reason=reason, filters=filters, output=output)


@app.command(epilog=examples("kiln release 7", "kiln release --mine", "kiln release --sweep 3"))
def release(
    job_ids: JobIds = None,
    team: TeamSel = None,
    name: NameSel = None,
    mine: MineSel = False,
    since: SinceSel = None,
    until: UntilSel = None,
    sweep: SweepSel = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Release held jobs: the scheduler plans them again (Slurm's scontrol release).

    Give job ids, or a filter over the held jobs you can see."""

    filters = {"team": team, "name": name, "mine": mine, "since": since, "until": until, "sweep": sweep}
    hold_or_release(job_ids, hold=False, reason=None, filters=filters, output=output)


def done_said(action: str, job_id: int, state: str | None) -> str:
    """What the CLI says of a job it cancelled, held or released, by the state the answer gives it."""
    if action == "cancel":
        return (
            f"job {job_id} CANCELLED"
            if state == JobState.CANCELLED.value
            else (f"cancelling job {job_id}: stopping, checkpoint first")
        )
    if action == "hold" and state == JobState.QUEUED.value:
        return f"job {job_id} held ({cli_name()} release {job_id} lets it start)"
    if action == "hold":
        return f"holding job {job_id}: stopping, checkpoint first, then held in the queue"
    return f"job {job_id} released: the scheduler plans it again"


def whole_sweep(sweep: int | None, job_ids: list[int] | None, *filters: Any) -> int | None:
    """The sweep given alone (``--sweep S``, no ids, no other filter), whose own endpoint acts on all its jobs in one
    transaction; None otherwise."""
    return sweep if not job_ids and not any(filters) else None


def act_on_sweep(api: Any, sweep_id: int, action: str, body: dict[str, Any] | None, output: OutputFormat) -> None:
    """Cancel, hold or release a whole sweep through ``POST /v1/sweeps/{id}/{action}``: all its jobs in one
    transaction (Determined's ``experiment kill``, Slurm's ``scancel`` of a job array), none if one may not be
    changed. Says what changed, job by job, from the sweep as it was just before and as the answer gives it."""
    say = console if output is OutputFormat.table else err_console
    before = {j["id"]: (j["state"], j["held"]) for j in api.get(f"/v1/sweeps/{sweep_id}")["jobs"]}
    sweep: dict[str, Any] = api.post(f"/v1/sweeps/{sweep_id}/{action}", json=body)
    # A running job asked to cancel is still running in the answer: it stops, checkpoint first. A job an adaptive
    # search proposed between the two requests is new to ``before``.
    changed = [
        j
        for j in sweep["jobs"]
        if (j["state"], j["held"]) != before.get(j["id"])
        or (action == "cancel" and j["state"] not in out.TERMINAL_STATES)
    ]
    for j in sorted(changed, key=lambda j: j["id"]):
        say.print(out.text(done_said(action, j["id"], j["state"])))
    if not changed:
        err_console.print(
            {"cancel": "no active job matches", "hold": "no queued job matches", "release": "no held job matches"}[
                action
            ]
        )
    if output is not OutputFormat.table:
        out.print_data(sweep, output)


def hold_or_release(
    job_ids: list[int] | None, *, hold: bool, reason: str | None, filters: dict[str, Any], output: OutputFormat
) -> None:
    """Hold (``hold``) or release the jobs given or matched; one already so is said, not changed (a filter picks
    only jobs not so already: their state is read only for ids given)."""

    def one(api: Any, job_id: int, say: Any) -> dict[str, Any]:
        job: dict[str, Any] = api.get(f"/v1/jobs/{job_id}") if job_ids else {}
        if job and bool(job.get("held_at")) == hold:
            said = f"is held already ({job.get('pending_message')})" if hold else f"is not held ({job.get('state')})"
            say.print(out.text(f"job {job_id} {said}"))
            return job
        if not hold:
            job = api.post(f"/v1/jobs/{job_id}/release")
        else:
            job = api.post(f"/v1/jobs/{job_id}/hold", json={"reason": reason} if reason else None)
        say.print(out.text(done_said("hold" if hold else "release", job_id, job.get("state"))))
        return job

    with client() as api:
        others = [v for k, v in filters.items() if k != "sweep"]
        if (whole := whole_sweep(filters["sweep"], job_ids, *others)) is not None:
            body = {"reason": reason} if hold and reason else None
            act_on_sweep(api, whole, "hold" if hold else "release", body, output)
            return
        act_on_each(api, queued_ids(api, job_ids, held=not hold, **filters), one, output)


@app.command(
    epilog=examples(
        "kiln update 7 --qos gold",
        "kiln update 7 --time-limit 2h",
        "kiln update 7 --gpus 4",
        "kiln update 7 --depends-on afterok:5 --depends-on 6",
    )
)
def update(
    job_id: JobArg,
    qos: Annotated[str | None, typer.Option("--qos", help="Another QoS class of the team's.")] = None,
    time_limit: Annotated[
        str | None, typer.Option("--time-limit", help="Seconds, 90m, 2h, 1d, or none (no limit).")
    ] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=0, help="Total GPUs (before its first checkpoint).")] = None,
    depends_on: Annotated[
        list[str] | None,
        typer.Option("--depends-on", help="JOB or afterok|afterany|afternotok:JOB, repeated; none: no dependency."),
    ] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Change a queued job's QoS class, time limit, GPUs or dependencies (Slurm's scontrol update), checked as a
    submission is.

    A running job: its time limit only, which its worker follows at once; you may lower it, a team admin or an
    admin may raise it. Another class: kiln hold it first (it stops, checkpoint first), change it, kiln release it.
    GPUs: only before the job's first checkpoint (kiln clone --set resources.gpus=N after). --depends-on replaces
    the job's dependencies."""
    body: dict[str, Any] = {}
    if qos is not None:
        body["qos"] = qos
    if time_limit is not None:
        body["time_limit_s"] = parse_duration(time_limit)
    if gpus is not None:
        body["gpus"] = gpus
    if depends_on is not None:
        body["depends_on"] = [] if [d.lower() for d in depends_on] == ["none"] else depends_on
    if not body:
        raise CliError("give what to change: --qos, --time-limit, --gpus, --depends-on", ExitCode.USAGE)
    with client() as api:
        job = api.patch(f"/v1/jobs/{job_id}", json=body)
    if output is not OutputFormat.table:
        out.print_data(job, output)
        return
    limit = (job.get("spec") or {}).get("time_limit_s")
    shown = out.fmt_duration(limit) if limit else "none"
    said = f"qos {job.get('qos')} (priority {job.get('priority')}), gpus {job.get('gpus')}, time limit {shown}"
    if depends_on is not None:
        said += f", depends on {', '.join((job.get('spec') or {}).get('depends_on') or []) or 'nothing'}"
    console.print(out.text(f"job {job_id}: {said}"))


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
