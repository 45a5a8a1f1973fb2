"""Commands that change jobs: ``kiln cancel``, ``hold``, ``release`` (by id, by a filter, or a whole sweep) and
``update``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli import output as out
from cli.app import OutputOpt, app, cli_name, client, examples
from cli.commands.job_input import JobArg, job_filter, parse_duration
from cli.errors import CliError, ExitCode
from cli.output import OutputFormat, console, err_console
from core.states import JobState

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
