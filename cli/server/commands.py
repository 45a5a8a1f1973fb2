"""Operator commands, which work on the database or this machine rather than through the API: the ``kiln admin``
sub-app, ``kiln migrate``, ``simulate``, ``up`` and ``down`` (the server side of the CLI: ``cli.server``)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.app import GLOBALS, app, examples
from cli.errors import CliError, ExitCode
from cli.output import console

admin_app = typer.Typer(
    help="Operator commands that talk to the database directly.",
    no_args_is_help=True,
    epilog=examples("kiln admin bootstrap --name admin --save"),
)

DatabaseOpt = Annotated[
    str | None, typer.Option("--database-url", help="Default: KILN_DATABASE_URL, else the SQLite file in KILN_HOME.")
]


def _database_url(flag: str | None) -> str:
    from core.settings import Settings

    return flag or Settings().resolved_database_url


@admin_app.command("bootstrap", epilog=examples("kiln admin bootstrap --name admin --save"))
def admin_bootstrap(
    name: Annotated[str, typer.Option("--name", help="The first admin's user name.")] = "admin",
    database_url: DatabaseOpt = None,
    save_config: Annotated[
        bool, typer.Option("--save/--no-save", help="Save the token in the CLI config for this API URL.")
    ] = False,
) -> None:
    """Create the first admin, the `default` team and a token (printed once). Talks to the database directly."""
    from cli.server.bootstrap import BootstrapError, bootstrap

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


@app.command(epilog=examples("kiln migrate", "kiln migrate --database-url postgresql+psycopg://kiln@db:5432/kiln"))
def migrate(database_url: DatabaseOpt = None) -> None:
    """Upgrade the database schema to the newest migration."""
    from cli.server.up import mask_url
    from core.migrate import upgrade

    url = _database_url(database_url)
    upgrade(url)
    console.print(f"database at {mask_url(url)} is at the newest migration")


SIMULATE_EXAMPLES = examples("kiln simulate synthetic:50 --hosts 2,1 --no-plots --out sim")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
    epilog=SIMULATE_EXAMPLES,
)
def simulate(ctx: typer.Context) -> None:
    """Replay a trace through the very policy the live scheduler runs: kiln simulate TRACE [--hosts N ...]
    (`kiln simulate --help` lists the simulator's options)."""
    try:
        from scheduler.simulate.replay import main as simulate_main
    except ImportError as exc:
        raise CliError(f"the simulator is not available: {exc}") from None
    try:
        code = simulate_main(list(ctx.args))
    except SystemExit as exc:  # argparse: --help (0) or bad arguments (2)
        code = exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    if code == 0 and {"-h", "--help"} & set(ctx.args):  # the simulator's own help, ended as every command's is
        typer.echo(f"\n{SIMULATE_EXAMPLES}")
    raise typer.Exit(int(code))


@app.command(
    epilog=examples("KILN_HOME=/srv/kiln kiln up --no-worker", "kiln up", "kiln up --detach --port 8431 --cpu-slots 4")
)
def up(
    port: Annotated[int, typer.Option("--port", help="API port.")] = 8421,
    host: Annotated[str, typer.Option("--host", help="API bind address.")] = "127.0.0.1",
    cpu_slots: Annotated[int, typer.Option("--cpu-slots", min=1, help="Training processes of the local worker.")] = 2,
    worker: Annotated[bool, typer.Option("--worker/--no-worker", help="Start a local worker.")] = True,
    submit_file: Annotated[
        str | None, typer.Option("--submit", help="Submit this job spec once kiln is ready.", metavar="FILE")
    ] = None,
    grace: Annotated[float, typer.Option("--grace", help="Seconds children get to stop before SIGKILL.")] = 30.0,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Run in the background; `kiln down` stops it.")
    ] = False,
) -> None:
    """Bring kiln up: migrate, bootstrap on first run, then run and supervise the API, scheduler and a worker.

    Its state (a SQLite database, the broker's file, logs, checkpoints, the lock that keeps a second kiln up off it)
    lives in KILN_HOME, default ./.kiln; KILN_DATABASE_URL and KILN_BROKER_URL put the database and broker on
    PostgreSQL and Redis instead. It saves the admin's token in the CLI config and prints it for the dashboard's
    sign-in (never into kiln's own logs)."""
    from cli.server.up import UpOptions, connect_host, run_up

    if detach:
        from cli.server.detach import start_detached
        from core.settings import Settings

        args = ["--port", str(port), "--host", host, "--cpu-slots", str(cpu_slots), "--grace", str(grace)]
        args += ["--worker" if worker else "--no-worker", *(["--submit", submit_file] if submit_file else [])]
        raise typer.Exit(start_detached(args, Settings().home.resolve(), f"http://{connect_host(host)}:{port}"))
    raise typer.Exit(
        run_up(
            UpOptions(host=host, port=port, cpu_slots=cpu_slots, worker=worker, submit_file=submit_file, grace_s=grace)
        )
    )


@app.command(epilog=examples("kiln down", "kiln down --timeout 120"))
def down(
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for a clean stop before killing what is left.")
    ] = 60.0,
) -> None:
    """Stop the kiln started with `kiln up --detach` (or any `kiln up` on this KILN_HOME), as Ctrl-C would."""
    from cli.server.detach import stop
    from core.settings import Settings

    raise typer.Exit(stop(Settings().home.resolve(), timeout))
