"""Job commands: ``kiln submit``, ``ls``, ``describe``, ``events``, ``logs`` (changing jobs: ``job_actions``)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
import yaml

from cli import output as out
from cli.app import OutputOpt, app, cli_name, client, examples, flatten, page_items
from cli.commands.job_input import (
    CheckOpt,
    JobArg,
    WorkdirOpt,
    job_filter,
    local_check,
    read_spec_file,
)
from cli.errors import CliError, ExitCode
from cli.output import OutputFormat, console, err_console
from core.trainer_protocol import command_exit_code


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
        console.print(out.table(out.ATTEMPT_COLUMNS, _with_command_exit_codes(attempts, events), title="Attempts"))
        for a in attempts:  # the compile cache's reuse, one line per attempt: hit/miss, source, key, time saved
            if isinstance(a.get("compile"), dict):
                console.print(f"attempt {a.get('number')}  compile: {a['compile'].get('summary')}", highlight=False)
    if checkpoints:
        console.print()
        console.print(out.table(out.CHECKPOINT_COLUMNS, checkpoints[-5:], title="Checkpoints (latest)"))
    if events:
        console.print()
        console.print(out.table(out.EVENT_COLUMNS, events[-15:], title="Recent events"))


def _with_command_exit_codes(attempts: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attempts as the table shows them: EXIT is the exit code of the job's own command where it ran one
    (``core.trainer_protocol.command_exit_code``, the dashboard's rule too), else the code kiln recorded."""
    codes: dict[Any, int] = dict(
        c for e in events if (c := command_exit_code(str(e.get("type")), e.get("data"))) is not None
    )
    return [{**a, "exit_code": codes.get(a.get("number"), a.get("exit_code"))} for a in attempts]


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
