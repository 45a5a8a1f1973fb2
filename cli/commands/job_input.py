"""What the job commands read from the user: a job id, spec files, the --workdir and --check options, times and
durations, and the job list's filter options."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.errors import CliError, ExitCode
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
