"""Every command's ``--help`` ends with examples of that very command (docs/cli.md promises it; issue 42, point 6:
12 of 38 commands had one). Walks the whole command tree, sub-apps and their own commands included, so a command
added without examples fails here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from cli.main import app


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command's path under ``command`` (the root ``()`` and each group included)."""
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from commands(sub, (*path, name))


def examples_at_the_end(help_text: str) -> list[str]:
    """The lines after the last ``Examples:`` line, if every line from there to the end is a command line."""
    lines = [line.strip() for line in help_text.splitlines() if line.strip()]
    if "Examples:" not in lines:
        return []
    tail = lines[len(lines) - lines[::-1].index("Examples:") :]
    return tail if all(line.startswith(("kiln ", "KILN_")) for line in tail) else []


def test_every_commands_help_ends_with_an_example_of_itself() -> None:
    paths = list(commands(typer.main.get_command(app)))
    assert len(paths) > 55 and ("up",) in paths and ("users", "create") in paths  # the walk reaches them all
    runner = CliRunner()
    missing = []
    for path in paths:
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})  # a plain terminal: nothing wraps
        assert shown.exit_code == 0, (path, shown.output)
        tail = examples_at_the_end(shown.output)
        if not tail or not tail[-1].startswith(" ".join(("kiln", *path))):
            missing.append(" ".join(("kiln", *path, "--help")))
    assert missing == [], f"--help without examples of the command at its end: {missing}"


def test_kiln_up_help_says_where_its_state_lives() -> None:
    shown = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "80"}).output
    assert "KILN_HOME" in shown and "KILN_DATABASE_URL" in shown and "kiln up --detach" in shown
