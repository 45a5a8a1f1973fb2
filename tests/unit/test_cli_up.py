"""`kiln up`'s pieces: what it starts, its backoff, its lock and token (the supervisor on real child processes:
tests/e2e/test_kiln_up_supervisor.py)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from cli.errors import CliError, ExitCode
from cli.server.supervisor import backoff_delay, stop_summary, tail
from cli.server.up import UpOptions, child_specs, connect_host, home_lock, mask_url, port_in_use


def test_child_specs() -> None:
    specs = child_specs(UpOptions(port=9999, cpu_slots=3), hostname="box", python="py")
    assert [s.name for s in specs] == ["api", "scheduler", "worker"]
    api = specs[0].argv
    assert api[:5] == ["py", "-m", "uvicorn", "api.app:create_app", "--factory"]
    assert api[api.index("--port") + 1] == "9999"
    assert specs[1].argv == ["py", "-m", "scheduler"]
    assert specs[2].argv == ["py", "-m", "workers", "--host", "box", "--cpu-slots", "3"]
    assert [s.name for s in child_specs(UpOptions(worker=False), hostname="b")] == ["api", "scheduler"]


def test_backoff_doubles_up_to_a_cap() -> None:
    assert [backoff_delay(n) for n in range(0, 8)] == [0, 1, 2, 4, 8, 16, 30, 30]


def test_connect_host_and_mask() -> None:
    assert connect_host("0.0.0.0") == "127.0.0.1"
    assert connect_host("10.0.0.5") == "10.0.0.5"
    assert mask_url("postgresql+psycopg://kiln:s3cret@db:5432/kiln") == "postgresql+psycopg://kiln:***@db:5432/kiln"
    assert mask_url("sqlite:////tmp/k.db") == "sqlite:////tmp/k.db"


def test_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port)


def test_home_lock_refuses_a_second_kiln_up(tmp_path: Path) -> None:
    with home_lock(tmp_path):
        assert (tmp_path / "up.lock").read_text() == str(os.getpid())
        # flock locks belong to the open file description: a second open from this process conflicts too
        with pytest.raises(CliError) as err, home_lock(tmp_path):
            pass
        assert err.value.code is ExitCode.CONFLICT
        assert f"pid {os.getpid()}" in err.value.message
    with home_lock(tmp_path):  # released
        pass


def test_tail(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(path, 3) == ["line 97", "line 98", "line 99"]
    assert tail(tmp_path / "missing.log") == []


def test_prepare_bootstraps_once_then_reuses_or_reissues_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from cli.server.bootstrap import token_owner
    from cli.server.up import prepare

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    db = f"sqlite:///{tmp_path / 'kiln.db'}"
    config = tmp_path / "xdg" / "kiln" / "config.json"

    first = prepare(db, "http://127.0.0.1:8421")
    assert "first run" in first.note and first.user == "admin"
    assert json.loads(config.read_text()) == {"api_url": "http://127.0.0.1:8421", "token": first.token}

    second = prepare(db, "http://127.0.0.1:9999")  # run again, on another port: same token, new URL
    assert "bootstrap skipped" in second.note and second.token == first.token
    assert json.loads(config.read_text())["api_url"] == "http://127.0.0.1:9999"

    config.unlink()  # the saved token is lost: a fresh one is issued for the existing admin
    third = prepare(db, "http://127.0.0.1:8421")
    assert "fresh token" in third.note and third.token != first.token
    assert token_owner(db, third.token) == "admin" and token_owner(db, first.token) == "admin"
    assert token_owner(db, "kiln_bogus") is None


def test_kiln_up_adds_a_profile_instead_of_rewriting_another_kilns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from cli.config import resolve, save
    from cli.server.up import prepare

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    config = tmp_path / "xdg" / "kiln" / "config.json"
    save("https://kiln.example.com", "kiln_theirs", config)  # the CLI already points at another kiln
    mine = prepare(f"sqlite:///{tmp_path / 'kiln.db'}", "http://127.0.0.1:8421")
    assert mine.profile == "local-8421" and "another kiln (https://kiln.example.com), kept" in mine.note
    saved = json.loads(config.read_text())
    assert (saved["api_url"], saved["token"]) == ("https://kiln.example.com", "kiln_theirs")
    assert saved["profiles"]["local-8421"] == {"api_url": "http://127.0.0.1:8421", "token": mine.token}
    chosen = resolve(profile_flag="local-8421", environ={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert (chosen.api_url, chosen.token) == ("http://127.0.0.1:8421", mine.token)
    assert resolve(environ={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}).token == "kiln_theirs"
    save("https://kiln.example.com", "kiln_rotated", config)  # the default changes: the profile stays
    assert json.loads(config.read_text())["profiles"]["local-8421"]["token"] == mine.token


def test_a_child_ended_by_kilns_own_sigterm_stopped_cleanly() -> None:
    """``kiln down`` logged "stopped (api -15, ...)": the API exits on the SIGTERM kiln sent it, as asked."""
    codes = {"api": -int(signal.SIGTERM), "scheduler": 0, "worker": 3, "extra": -int(signal.SIGKILL), "late": None}
    assert stop_summary(codes) == "api ok, scheduler ok, worker exit 3, extra killed by SIGKILL, late not started"
