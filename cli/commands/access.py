"""Who you are to the API: ``kiln login``, ``logout``, ``whoami``, and the ``kiln tokens`` and ``kiln users``
sub-apps."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from cli import output as out
from cli.app import GLOBALS, OutputOpt, app, client, examples, show_list
from cli.output import OutputFormat, console

tokens_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=False)
users_app = typer.Typer(help="Users (admin): list, create.", no_args_is_help=False)


@app.command(epilog=examples("kiln login --url http://127.0.0.1:8421", "kiln login --sso"))
def login(
    url: Annotated[str | None, typer.Option("--url", help="API base URL.")] = None,
    token: Annotated[str | None, typer.Option("--token", help="API token (prompted for when absent).")] = None,
    sso: Annotated[bool, typer.Option("--sso", help="Sign in at your organisation's provider (device code).")] = False,
) -> None:
    """Save the API URL and token (verified against /v1/me) in ~/.config/kiln/config.json (mode 0600); with
    --sso, the token kiln issues when you sign in at your organisation's OpenID provider."""
    from cli.client import KilnClient
    from cli.config import CliConfig, config_path, normalize_url, resolve, save

    # The URL as every other command finds it (--api-url, KILN_API_URL, the saved one, the default): a login after
    # `kiln logout` or `kiln up --port N` went to the default address instead.
    url = normalize_url(url or resolve(url_flag=GLOBALS.api_url).api_url)
    if sso:
        from cli.sso import sign_in

        if token:
            raise typer.BadParameter("give --sso or --token, not both", param_hint="--sso")

        answer = sign_in(url, lambda line: console.print(line, markup=False))
        token = str(answer.get("secret") or "")
    token = token or GLOBALS.token or typer.prompt("API token", hide_input=True)
    with KilnClient(CliConfig(url, token, "flag", "flag")) as api:
        me = api.get("/v1/me")
    path = save(url, token, config_path())
    name = me.get("name", "?") if isinstance(me, dict) else "?"
    console.print(Text.assemble(f"logged in to {url} as ", out.text(name, "bold"), f"; saved to {path}"))


@app.command(epilog=examples("kiln logout"))
def logout() -> None:
    """Forget the saved token (the URL stays)."""
    from cli.config import DEFAULT_API_URL, config_path, load_file, save

    data = load_file()
    if not data.get("token"):
        console.print("not logged in")
        return
    save(str(data.get("api_url") or DEFAULT_API_URL), None)
    console.print(f"token removed from {config_path()}")


@app.command(epilog=examples("kiln whoami -o json"))
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


# -- tokens -----------------------------------------------------------------------------------------------------


@tokens_app.callback(
    invoke_without_command=True, epilog=examples("kiln tokens", "kiln tokens create ci --scope read --expires-in 30")
)
def tokens(ctx: typer.Context, output: OutputOpt = OutputFormat.table) -> None:
    """Your API tokens (subcommands: create, revoke)."""
    if ctx.invoked_subcommand is not None:
        return
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
    show_list("/v1/tokens", columns, output)


@tokens_app.command(
    "create",
    epilog=examples(
        "kiln tokens create ci --scope read --expires-in 30",
        "kiln tokens create prometheus --scope metrics --user prometheus",
    ),
)
def tokens_create(
    name: str,
    scope: Annotated[
        list[str] | None,
        typer.Option("--scope", help="read, write, admin, metrics (repeatable; within your own token's)."),
    ] = None,
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
    if output is not OutputFormat.table:
        out.print_data(data, output)
        return
    console.print(out.text(f"token {data.get('id')} ({name}) created; the secret is shown only this once:"))
    console.print(data.get("secret"), markup=False)


@tokens_app.command("revoke", epilog=examples("kiln tokens revoke 3"))
def tokens_revoke(token_id: int) -> None:
    """Revoke a token by id."""
    with client() as api:
        api.delete(f"/v1/tokens/{token_id}")
    console.print(f"token {token_id} revoked")


# -- users ------------------------------------------------------------------------------------------------------


@users_app.callback(
    invoke_without_command=True, epilog=examples("kiln users", "kiln users create alice --email alice@example.com")
)
def users(ctx: typer.Context, output: OutputOpt = OutputFormat.table) -> None:
    """Every user, by name (admin; subcommand: create)."""
    if ctx.invoked_subcommand is not None:
        return
    columns: list[out.Column] = [
        ("NAME", lambda u: u.get("name")),
        ("ADMIN", lambda u: "yes" if u.get("is_admin") else "-"),
        ("EMAIL", lambda u: u.get("email") or "-"),
        ("TEAMS", lambda u: ", ".join(f"{t['team']} ({t['role']})" for t in u.get("teams") or []) or "-"),
        ("CREATED", lambda u: out.fmt_time(u.get("created_at"))),
    ]
    show_list("/v1/users", columns, output)


@users_app.command(
    "create",
    epilog=examples(
        "kiln users create alice --email alice@example.com",
        "kiln users create prometheus",
    ),
)
def users_create(
    name: str,
    email: Annotated[str | None, typer.Option("--email", help="Their e-mail address.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="A global admin (every team, every setting).")] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Create a user (admin). They join teams with kiln teams add-member, and sign in with a token made for them
    (kiln tokens create NAME --user USER); a user of no team may still hold a scrape-only token for /metrics."""
    body: dict[str, Any] = {"name": name, "email": email, "is_admin": admin}
    with client() as api:
        data = api.post("/v1/users", json=body)
    if output is not OutputFormat.table:
        out.print_data(data, output)
        return
    console.print(out.text(f"user {data.get('name')} created{' (admin)' if data.get('is_admin') else ''}"))
