"""The CLI where no API is needed: local spec validation, unreachable servers, usage errors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.errors import ExitCode
from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("KILN_TOKEN", raising=False)
    monkeypatch.delenv("KILN_API_URL", raising=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_api_says_so_with_its_own_exit_code() -> None:
    port = closed_port()
    result = runner.invoke(app, ["--api-url", f"http://127.0.0.1:{port}", "ls"])
    assert result.exit_code == ExitCode.UNREACHABLE
    assert f"cannot reach the kiln API at http://127.0.0.1:{port}" in result.output
    assert "kiln up" in result.output
    assert "Traceback" not in result.output


def test_env_url_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    port = closed_port()
    monkeypatch.setenv("KILN_API_URL", f"http://127.0.0.1:{port}")
    result = runner.invoke(app, ["describe", "1"])
    assert result.exit_code == ExitCode.UNREACHABLE
    assert str(port) in result.output


def test_invalid_spec_is_rejected_locally_with_field_paths(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: Bad Name\nteam: default\nrecipe: {name: gpt}\nresources: {gpus: -1}\nsurprise: 1\n")
    result = runner.invoke(app, ["--api-url", f"http://127.0.0.1:{closed_port()}", "submit", str(spec)])
    assert result.exit_code == ExitCode.INVALID, result.output
    for path in ("name:", "resources.gpus:", "surprise:"):
        assert f"  - {path}" in result.output
    assert "cannot reach" not in result.output  # it never got as far as the network


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nteam: [unclosed\n")
    result = runner.invoke(app, ["submit", str(spec)])
    assert result.exit_code == ExitCode.INVALID
    assert "malformed YAML at line" in result.output
    # the problem in words at its line and column, without PyYAML's internals ("$:", "<unicode string>")
    assert (
        "  - line 3, column 1: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence from "
        "line 2, column 7)" in result.output
    )
    assert "<unicode string>" not in result.output and "$:" not in result.output


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["submit", str(tmp_path / "nope.yaml")])
    assert result.exit_code == ExitCode.USAGE
    assert "cannot read" in result.output


def test_bad_arguments_are_usage_errors() -> None:
    assert runner.invoke(app, ["describe", "not-a-number"]).exit_code == ExitCode.USAGE
    assert runner.invoke(app, ["ls", "--output", "xml"]).exit_code == ExitCode.USAGE
    assert runner.invoke(app, ["teams", "create", "x", "--quota", "H200"]).exit_code == ExitCode.USAGE


def test_sla_set_without_changes_is_refused_before_any_request() -> None:
    result = runner.invoke(app, ["--api-url", f"http://127.0.0.1:{closed_port()}", "sla", "set", "default"])
    assert result.exit_code == ExitCode.USAGE
    assert "nothing to change" in result.output


def test_admin_bootstrap_on_an_unmigrated_database_says_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    result = runner.invoke(app, ["admin", "bootstrap", "--database-url", url])
    assert result.exit_code == ExitCode.FAILURE
    assert "kiln migrate" in result.output


def test_admin_bootstrap_then_second_bootstrap_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kiln.db'}"
    assert runner.invoke(app, ["migrate", "--database-url", url]).exit_code == 0
    first = runner.invoke(app, ["admin", "bootstrap", "--database-url", url, "--name", "root"])
    assert first.exit_code == 0, first.output
    assert "kiln_" in first.output
    second = runner.invoke(app, ["admin", "bootstrap", "--database-url", url])
    assert second.exit_code == ExitCode.CONFLICT
    assert "admin already exists" in second.output


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for name in (
        "login",
        "submit",
        "ls",
        "describe",
        "events",
        "logs",
        "cancel",
        "why",
        "teams",
        "qos",
        "usage",
        "sla",
        "hosts",
        "tokens",
        "admin",
        "simulate",
        "migrate",
        "up",
        "down",
    ):
        assert f" {name} " in result.output


def test_simulate_delegates_to_the_scheduler_simulator(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    argv = ["simulate", "synthetic:20", "--hosts", "2", "--no-plots", "--out", str(out)]
    result = runner.invoke(app, [*argv, "--workers", "1"])  # the replays in this process: a unit test starts none
    assert result.exit_code == 0, result.output
    assert "| kiln |" in result.output and "| fifo |" in result.output
    assert runner.invoke(app, ["simulate", "synthetic:5", "--bogus"]).exit_code == ExitCode.USAGE
    helped = runner.invoke(app, ["simulate", "--help"])
    assert helped.exit_code == 0 and "--gpus-per-host" in helped.output


def test_since_and_until_take_a_time_ago_or_an_iso_time() -> None:
    from datetime import UTC, datetime

    import typer

    from cli.commands.job_input import parse_when

    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert parse_when("90m", now=now) == "2026-12-03T10:30:00Z"
    assert parse_when("2d", now=now) == "2026-12-01T12:00:00Z"
    assert parse_when("1w", now=now) == "2026-11-26T12:00:00Z"
    assert parse_when("2026-11-03", now=now) == "2026-11-03T00:00:00Z"  # no zone: UTC
    assert parse_when("2026-11-03T14:00+01:00", now=now) == "2026-11-03T13:00:00Z"
    for bad in ("yesterday", "2h ago", "-3d", "2026-13-01"):
        with pytest.raises(typer.BadParameter):
            parse_when(bad, now=now)
