"""The root ``kiln`` Typer app and what every command module shares: the global options, the API client, the
``--output`` option and the error reporting that turns :class:`CliError` into one line and an exit code.

The command modules (``cli.commands``) import this one and register on :data:`app`; ``cli.main`` puts it all
together. Like them, this module imports nothing heavy at the top, so ``kiln --help`` stays fast.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer._click import Context as ClickContext
from typer.core import TyperGroup

from cli.config import ENV_CLI_NAME
from cli.errors import CliError, ExitCode
from cli.output import Column, OutputFormat, err_console
from core.secrets import SecretError


class KilnGroup(TyperGroup):
    """Turn :class:`CliError`, a bad secret file (and Ctrl-C) into a message on stderr and an exit code, never a
    traceback."""

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            report(exc)
            raise typer.Exit(int(exc.code)) from None
        except SecretError as exc:  # a password file named in the environment is missing or empty
            report(CliError(str(exc)))
            raise typer.Exit(int(ExitCode.FAILURE)) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def report(exc: CliError) -> None:
    from rich.text import Text

    from cli.output import safe

    # Messages are text, not markup, and carry no terminal control (a problem's detail may echo the request).
    err_console.print(Text.assemble(("error:", "bold red"), " ", safe(exc.message)))
    for line in exc.details:
        err_console.print(Text(f"  - {safe(line)}"), highlight=False)


def cli_name() -> str:
    """The command as the user types it, for hints they paste: ``./kiln`` from a fresh clone (the wrapper sets
    KILN_CLI_NAME: no ``kiln`` is on the PATH then), else ``kiln`` (the client's environment: ``cli.config``)."""
    return os.environ.get(ENV_CLI_NAME, "kiln")


def examples(*commands: str) -> str:
    """A command's epilog, which ends its ``--help``: one command line a paragraph (docs/cli.md promises every
    command's help ends with examples; tests/unit/test_cli_help.py walks them all)."""
    return "\n".join(["Examples:", *commands])


app = typer.Typer(
    cls=KilnGroup,
    name="kiln",
    help="kiln: GPU training jobs under SLA contracts.",
    epilog=examples("kiln up", "kiln submit examples/gpt-tiny.yaml --follow", "kiln ls --mine --active"),
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals may hold the API token
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=True,  # kiln --install-completion (bash, zsh, fish, PowerShell)
)


class _Globals:
    api_url: str | None = None
    token: str | None = None
    profile: str | None = None


GLOBALS = _Globals()

OutputOpt = Annotated[
    OutputFormat,
    typer.Option("--output", "-o", help="table for people; json or yaml for scripts.", case_sensitive=False),
]


@app.callback()
def main(
    api_url: Annotated[
        str | None, typer.Option("--api-url", help="API base URL (default: KILN_API_URL, then the config file).")
    ] = None,
    token: Annotated[str | None, typer.Option("--token", help="API token (default: KILN_TOKEN, then config).")] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", help="A named entry of the CLI config (default: KILN_PROFILE).")
    ] = None,
) -> None:
    GLOBALS.api_url = api_url
    GLOBALS.token = token
    GLOBALS.profile = profile


def client() -> Any:
    from cli.client import KilnClient
    from cli.config import ConfigError, resolve

    try:
        cfg = resolve(url_flag=GLOBALS.api_url, token_flag=GLOBALS.token, profile_flag=GLOBALS.profile)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    return KilnClient(cfg)


def page_items(page: Any) -> list[dict[str, Any]]:
    """The items of a list endpoint's answer, whether paged (``{"items": [...]}``) or a bare list."""
    if isinstance(page, dict) and "items" in page:
        return list(page["items"])
    return list(page or [])


def show_list(
    path: str,
    columns: Sequence[Column],
    output: OutputFormat,
    params: dict[str, Any] | None = None,
    limit: int | None = None,
) -> None:
    """GET a list endpoint, following its pages (``next_cursor``) to the end or to ``limit`` items, and print the
    items: a table, or JSON with ``-o json``."""
    from cli import output as out

    with client() as api:
        items = list(api.paginate(path, params or {}, limit=limit, page_size=min(limit or 500, 500)))
    out.render(items, output, lambda: out.table(columns, items))


def flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts as ``a.b``-keyed pairs, for :func:`cli.output.kv_table`."""
    pairs: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            pairs.extend(flatten(value, f"{prefix}{key}."))
        else:
            pairs.append((f"{prefix}{key}", value))
    return pairs
