"""The ``kiln`` command.

Every command that talks to the API goes through :class:`cli.client.KilnClient`, whose errors become one clear
line and a distinct exit code (see :class:`cli.errors.ExitCode`). Heavy modules (httpx, pydantic, SQLAlchemy,
the scheduler) are imported inside the commands that need them, so ``kiln --help`` stays fast; nothing here
imports torch.

This module puts the command line together: the root app and what the commands share live in :mod:`cli.app`, the
commands in :mod:`cli.commands` (importing it registers them), and the sub-apps are added here.
"""

from __future__ import annotations

from cli.app import app, report
from cli.commands.access import tokens_app, users_app
from cli.commands.checkpoints import checkpoint_app
from cli.commands.datasets import datasets_app
from cli.commands.reuse import sweep_app
from cli.commands.teams import invitations_app, sla_app, teams_app
from cli.commands.webhooks import webhooks_app
from cli.server.commands import admin_app

__all__ = ["app", "report"]  # the entry point (pyproject's ``kiln = "cli.main:app"``) and its error reporter

# `kiln --help` lists the sub-apps after the commands, in the order they are added.
app.add_typer(sweep_app, name="sweep")
app.add_typer(teams_app, name="teams")
app.add_typer(datasets_app, name="datasets")
app.add_typer(tokens_app, name="tokens")
app.add_typer(users_app, name="users")
app.add_typer(sla_app, name="sla")
app.add_typer(invitations_app, name="invitations")
app.add_typer(webhooks_app, name="webhooks")
app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(admin_app, name="admin")


if __name__ == "__main__":  # pragma: no cover
    app()
