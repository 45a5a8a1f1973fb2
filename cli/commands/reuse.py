"""Reusing a job: ``kiln clone`` (a job's spec again, with changes) and ``kiln sweep`` (one spec over a grid, a
list or random draws of settings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from cli import output as out
from cli.app import OutputOpt, app, cli_name, client, examples
from cli.commands.job_input import CheckOpt, JobArg, WorkdirOpt, local_check, read_text, spec_errors
from cli.commands.jobs import report_submitted, submit_text
from cli.errors import CliError, ExitCode
from cli.output import Column, OutputFormat, console, err_console

sweep_app = typer.Typer(
    help="Sweeps: one spec over a grid, a list or random draws of settings, a job each.",
    no_args_is_help=True,
    epilog=examples("kiln sweep submit examples/digits/sweep.yaml --workdir examples/digits", "kiln sweep show 1"),
)


def apply_override(spec: dict[str, Any], item: str) -> None:
    """``KEY=VALUE`` into ``spec``: KEY a dotted path (``recipe.hyperparameters.lr``), VALUE read as YAML (``0.1``,
    ``true``, ``[1, 2]``; quote a word YAML would read otherwise: ``mode='off'``)."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise CliError(f"--set {item!r}: expected KEY=VALUE, e.g. recipe.hyperparameters.lr=0.001", ExitCode.USAGE)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    *parents, leaf = key.strip().split(".")
    node = spec
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise CliError(f"--set {item!r}: {part!r} is not a section of the spec", ExitCode.USAGE)
        node = child
    node[leaf] = value


@app.command(
    epilog=examples("kiln clone 7 --set recipe.hyperparameters.lr=0.001", "kiln clone 7 -s steps=2000 --name longer -f")
)
def clone(
    job_id: JobArg,
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="KEY=VALUE in the spec (a dotted path), repeatable.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="The new job's name (default: the same).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Follow the new job until it ends.")] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Submit a job's spec again, with changes."""
    import yaml

    with client() as api:
        spec = api.get(f"/v1/jobs/{job_id}")["spec"]
        for item in set_ or []:
            apply_override(spec, item)
        if name:
            spec["name"] = name
        text = yaml.safe_dump(spec, sort_keys=False)
        validate_locally(text, f"job {job_id}'s spec with your changes")
        report_submitted(api, submit_text(api, text), follow=follow, output=output)


def validate_locally(text: str, what: str) -> None:
    from core.spec import SpecError, parse_spec_text

    try:
        parse_spec_text(text)
    except SpecError as exc:
        raise spec_errors(what, "invalid job spec", exc.errors) from None


def sweep_rows(sweep: dict[str, Any], sort: str | None = None) -> tuple[list[Column], list[dict[str, Any]]]:
    """The sweep's jobs as table rows, best first (the API's order) or by ``sort`` (a column's name, ``-`` first for
    largest first), with a column per setting it varies and per metric its jobs' evaluations report."""
    rows = [{**j, "rank": i + 1} for i, j in enumerate(sweep.get("jobs", []))]
    metrics = sorted({name for j in rows for name in j.get("metrics") or {}})
    keyed: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("rank", lambda r: r["rank"]),
        ("id", lambda r: r["id"]),
        ("name", lambda r: r["name"]),
        ("state", lambda r: r["state"]),
        *((key, _setting(key)) for key in sweep.get("keys", [])),
        ("step", lambda r: r["last_step"]),
        ("loss", lambda r: r["last_loss"]),
        *((name, _metric(name)) for name in metrics),
    ]
    if sort:
        by = dict(keyed)
        name = sort.lstrip("-").lower()
        if name not in by:
            raise CliError(f"--sort {sort}: no such column; one of: {', '.join(by)}", ExitCode.USAGE)
        present = [r for r in rows if by[name](r) is not None]  # a job with no value yet goes last either way
        present.sort(key=lambda r: by[name](r), reverse=sort.startswith("-"))
        rows = present + [r for r in rows if by[name](r) is None]
    columns: list[Column] = [
        ("RANK", lambda r: r["rank"]),
        ("ID", lambda r: r["id"]),
        ("NAME", lambda r: r["name"]),
        ("STATE", lambda r: out.state_text(r["state"])),
    ]
    columns += [(key.upper(), _setting(key)) for key in sweep.get("keys", [])]
    columns += [("STEP", lambda r: f"{r['last_step']}/{r['steps']}"), ("LOSS", lambda r: out.fmt_loss(r["last_loss"]))]
    columns += [(name.upper(), _fmt_metric(name)) for name in metrics]
    columns += [("REASON", lambda r: r.get("pending_reason") or r.get("exit_reason") or "-")]
    return columns, rows


def _setting(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: (row.get("settings") or {}).get(key)


def _metric(name: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda row: (row.get("metrics") or {}).get(name)


def _fmt_metric(name: str) -> Callable[[dict[str, Any]], str]:
    value = _metric(name)
    return lambda row: "-" if value(row) is None else f"{value(row):.4g}"


@sweep_app.command(
    "submit",
    epilog=examples(
        "kiln sweep submit examples/digits/sweep.yaml --workdir examples/digits", "kiln sweep submit sweep.yaml --hold"
    ),
)
def sweep_submit(
    file: Annotated[str, typer.Argument(help="A job spec with a sweep section (YAML or JSON; '-' reads stdin).")],
    workdir: WorkdirOpt = None,
    check: CheckOpt = None,
    hold: Annotated[bool, typer.Option("--hold", help="Submit its jobs held: none starts until kiln release.")] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Submit a sweep: one job per point of its grid (every combination) or list, or COUNT random draws.

    Example file: a job spec plus
      sweep: {grid: {lr: [0.001, 0.003], batch_size: [8, 16]}, max_concurrent: 2}
      sweep: {random: {lr: {log_uniform: [0.0001, 0.01]}, width: [64, 128]}, count: 8,
              objective: {metric: accuracy, goal: maximize}}
    """
    from cli import code as user_code

    text = read_text(file)
    local_check(_jobs(text, file) if check or workdir is not None else [], workdir, check)
    params = {"hold": "true"} if hold else None
    with client() as api:
        if workdir is not None:
            data = user_code.with_code(text, file)
            user_code.upload(api, data, workdir)
            sweep = api.post("/v1/sweeps", json=data, params=params)
        else:
            sweep = api.post(
                "/v1/sweeps", content=text.encode(), headers={"Content-Type": "application/yaml"}, params=params
            )
    if output is not OutputFormat.table:
        out.print_data(sweep, output)
        return
    limit = sweep.get("max_concurrent")
    parameters = sweep.get("parameters") or {}
    seed = parameters.get("seed")
    # An adaptive search submits its first random draws now and proposes the others as they end.
    jobs = (
        (
            f"{len(sweep['jobs'])} jobs now, {parameters.get('count')} in all by TPE (each next one proposed as "
            "others end)"
        )
        if sweep.get("search")
        else f"{len(sweep['jobs'])} jobs"
    )
    console.print(
        out.text(
            f"submitted sweep {sweep['id']} ({sweep['name']}, team {sweep['team']}): "
            f"{jobs}"
            + (f", at most {limit} at once" if limit else "")
            + (" (held)" if hold else "")
            + (f", drawn with seed {seed}" if seed is not None else "")
            + f"; best first by {_objective(sweep)}"
        )
    )
    console.print(out.text(f"see it with: {cli_name()} sweep show {sweep['id']}"))


def _jobs(text: str, path: str) -> list[dict[str, Any]]:
    """The specs of the sweep's jobs (an adaptive search's first draws), expanded here as the API will (its errors
    as the API would say them)."""
    import yaml

    from core.services.errors import InvalidInput
    from core.spec import SpecError
    from core.sweeps.spec import parse

    document = yaml.safe_load(text)
    if not isinstance(document, dict):
        raise CliError(f"{path}: a sweep is a job spec with a sweep section", ExitCode.INVALID)
    try:
        _, specs, _ = parse(document)
    except (SpecError, InvalidInput) as exc:
        raise spec_errors(path, "invalid sweep", exc.errors) from None
    return [spec.model_dump(mode="json", exclude_none=True) for spec in specs]


def _best(sweep: dict[str, Any]) -> str:
    """The objective's value of the sweep's best job (``accuracy 0.975``), ``-`` while none has one."""
    metric = (sweep.get("objective") or {}).get("metric", "loss")
    best = (sweep.get("jobs") or [{}])[0]
    if metric == "loss":
        return "-" if best.get("last_loss") is None else f"loss {out.fmt_loss(best['last_loss'])}"
    value = _metric(metric)(best)
    return "-" if value is None else f"{metric} {value:.4g}"


def _objective(sweep: dict[str, Any]) -> str:
    objective = sweep.get("objective") or {}
    return f"{objective.get('metric', 'loss')} ({objective.get('goal', 'minimize')})"


@sweep_app.command("show", epilog=examples("kiln sweep show 2", "kiln sweep show 2 --sort -accuracy"))
def sweep_show(
    sweep_id: Annotated[int, typer.Argument(help="The sweep id.", min=1, show_default=False)],
    sort: Annotated[
        str | None,
        typer.Option("--sort", help="Order by a column (a setting, loss, a metric...); '-accuracy': largest first."),
    ] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """A sweep's jobs, best first: succeeded ones by final loss, then the others; a column per setting it varies
    and per metric its jobs' evaluations report."""
    with client() as api:
        sweep = api.get(f"/v1/sweeps/{sweep_id}")
    columns, rows = sweep_rows(sweep, sort)
    title = f"Sweep {sweep['id']} {sweep['name']} (team {sweep['team']}), best first by {_objective(sweep)}"
    if sweep.get("early_stopping"):
        title += f"\nStops early by {sweep['early_stopping']}"
    if sweep.get("search"):
        closed = f" (proposes no more: {sweep['search_closed']})" if sweep.get("search_closed") else ""
        title += f"\nSearches by {sweep['search']}{closed}"
    out.render(sweep, output, lambda: out.table(columns, rows, title=title))


@sweep_app.command("ls", epilog=examples("kiln sweep ls", "kiln sweep ls -o json"))
def sweep_ls(output: OutputOpt = OutputFormat.table) -> None:
    """Sweeps you can see, newest first."""
    with client() as api:
        items = list(api.paginate("/v1/sweeps", {}, limit=None, page_size=50))
    if output is not OutputFormat.table:
        out.print_data(items, output)
        return
    if not items:
        err_console.print("no sweeps")
        return
    cols: list[Column] = [
        ("ID", lambda s: s["id"]),
        ("NAME", lambda s: s["name"]),
        ("TEAM", lambda s: s["team"]),
        ("JOBS", lambda s: len(s["jobs"])),
        ("SUCCEEDED", lambda s: sum(j["state"] == "SUCCEEDED" for j in s["jobs"])),
        ("BEST", _best),
    ]
    console.print(out.table(cols, items))
