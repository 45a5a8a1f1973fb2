"""``kiln datasets``: a team's registered datasets (docs/user-code.md, "Datasets")."""

from __future__ import annotations

from typing import Annotated

import typer

from cli import output as out
from cli.app import OutputOpt, client, examples, show_list
from cli.output import OutputFormat

datasets_app = typer.Typer(
    help="A team's datasets: names for read-only data directories under kiln's storage root.", no_args_is_help=False
)

TeamOpt = Annotated[str, typer.Option("--team", "-t", help="The team (default: default).")]

DATASET_COLUMNS: list[out.Column] = [
    ("NAME", lambda d: d.get("name")),
    ("PATH", lambda d: d.get("path")),
    ("AVAILABLE", lambda d: "yes" if d.get("available") else f"NO: {d.get('problem')}"),
    ("DESCRIPTION", lambda d: d.get("description") or "-"),
    ("CREATED", lambda d: out.fmt_time(d.get("created_at"))),
]


@datasets_app.callback(invoke_without_command=True, epilog=examples("kiln datasets --team vision"))
def datasets(ctx: typer.Context, team: TeamOpt = "default", output: OutputOpt = OutputFormat.table) -> None:
    """List the team's datasets (subcommands: ls, add, rm)."""
    if ctx.invoked_subcommand is None:
        show_list(f"/v1/teams/{team}/datasets", DATASET_COLUMNS, output)


@datasets_app.command("ls", epilog=examples("kiln datasets ls --team vision -o json"))
def datasets_ls(team: TeamOpt = "default", output: OutputOpt = OutputFormat.table) -> None:
    """List the team's datasets, and whether each is there now."""
    show_list(f"/v1/teams/{team}/datasets", DATASET_COLUMNS, output)


@datasets_app.command(
    "add",
    epilog=examples("kiln datasets add digits-npz datasets/default/digits-npz"),
)
def datasets_add(
    name: Annotated[str, typer.Argument(help="The name a job's spec uses (datasets: [NAME]).")],
    path: Annotated[
        str,
        typer.Argument(help="A directory relative to kiln's storage root: datasets/TEAM/... or datasets/_shared/..."),
    ],
    team: TeamOpt = "default",
    description: Annotated[str | None, typer.Option("--description", "-d", help="What it holds.")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Register a dataset (team-admin)."""
    body = {"name": name, "path": path, **({"description": description} if description else {})}
    with client() as api:
        data = api.post(f"/v1/teams/{team}/datasets", json=body)
    out.render(
        data,
        output,
        lambda: f"dataset {data['name']} registered in team {team}: {data['path']} (read-only for jobs that name it)",
    )


@datasets_app.command("rm", epilog=examples("kiln datasets rm digits-npz --team default"))
def datasets_rm(name: str, team: TeamOpt = "default") -> None:
    """Remove a dataset (team-admin; refused while a job that has not ended names it). The files stay where they are."""
    with client() as api:
        api.delete(f"/v1/teams/{team}/datasets/{name}")
    out.console.print(f"dataset {name} removed from team {team} (its files were not touched)")
