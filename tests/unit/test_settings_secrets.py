"""Database and broker passwords from files (KILN_DATABASE_PASSWORD_FILE, KILN_BROKER_PASSWORD_FILE): what goes
into the URLs, as the real clients (SQLAlchemy, psycopg, redis-py, kombu) parse them, and the errors."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import redis
from kombu import Connection
from sqlalchemy import make_url
from typer.testing import CliRunner

from core.secrets import SecretError
from core.settings import Settings
from scheduler.live.leader import psycopg_conninfo

PG = "postgresql+psycopg://kiln@postgres:5432/kiln"
REDIS = "redis://redis:6379/0"
# Characters a URL would misread if they went in unencoded. (Not a space: SQLAlchemy's URL rendering, which the
# scheduler's leader election hands to libpq, leaves it unencoded and libpq refuses it; docs/deploy.md advises
# passwords of letters and digits.)
HARD = "p@ss:w/rd%?#&+é"


def secret(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_passwords_from_files_reach_every_client_intact(tmp_path: Path) -> None:
    s = Settings(
        database_url=PG,
        database_password_file=secret(tmp_path, "db", HARD + "\n"),
        broker_url=REDIS,
        broker_password_file=secret(tmp_path, "redis", HARD + "\n\n"),
    )
    assert make_url(s.resolved_database_url).password == HARD
    assert make_url(s.resolved_database_url).username == "kiln"
    assert psycopg.conninfo.conninfo_to_dict(psycopg_conninfo(s.resolved_database_url))["password"] == HARD
    pool_kwargs = redis.Redis.from_url(s.resolved_broker_url).connection_pool.connection_kwargs
    assert pool_kwargs["password"] == HARD and pool_kwargs["host"] == "redis"
    assert Connection(s.resolved_broker_url).password == HARD
    assert HARD not in s.resolved_database_url  # percent-encoded, not pasted


def test_only_trailing_newlines_are_dropped(tmp_path: Path) -> None:
    s = Settings(database_url=PG, database_password_file=secret(tmp_path, "db", "  two words \n"))
    assert make_url(s.resolved_database_url).password == "  two words "


def test_without_files_the_urls_are_used_as_given(tmp_path: Path) -> None:
    s = Settings(database_url=PG, broker_url=REDIS, home=tmp_path)
    assert (s.resolved_database_url, s.resolved_broker_url) == (PG, REDIS)
    assert Settings(home=tmp_path).resolved_database_url == f"sqlite:///{tmp_path / 'kiln.db'}"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"database_url": PG, "database_password_file": "missing"}, "KILN_DATABASE_PASSWORD_FILE={}: no such file"),
        ({"database_url": PG, "database_password_file": "empty"}, "KILN_DATABASE_PASSWORD_FILE={}: the file is empty"),
        ({"broker_url": REDIS, "broker_password_file": "dir"}, "KILN_BROKER_PASSWORD_FILE={}: cannot be read"),
        ({"database_password_file": "good"}, "KILN_DATABASE_PASSWORD_FILE is set but KILN_DATABASE_URL is not"),
        ({"database_url": "sqlite:////x.db", "database_password_file": "good"}, "names no server"),
        ({"broker_url": "redis://:other@redis:6379/0", "broker_password_file": "good"}, "carries another password"),
    ],
)
def test_a_bad_secret_stops_the_settings_naming_it(tmp_path: Path, fields: dict[str, str], message: str) -> None:
    secret(tmp_path, "empty", "\n")
    secret(tmp_path, "good", "s3cret\n")
    (tmp_path / "dir").mkdir()
    values = {k: (tmp_path / v if k.endswith("_file") else v) for k, v in fields.items()}
    path = next((v for k, v in values.items() if k.endswith("_file")), None)
    with pytest.raises(SecretError) as info:
        Settings(**values)  # type: ignore[arg-type]
    assert message.format(path) in str(info.value)


def test_the_same_password_in_the_url_and_the_file_is_accepted(tmp_path: Path) -> None:
    s = Settings(broker_url="redis://:s3cret@redis:6379/0", broker_password_file=secret(tmp_path, "r", "s3cret"))
    assert Connection(s.resolved_broker_url).password == "s3cret"


def test_the_cli_reports_a_bad_secret_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.main import app

    monkeypatch.setenv("KILN_DATABASE_URL", PG)
    monkeypatch.setenv("KILN_DATABASE_PASSWORD_FILE", str(tmp_path / "nope"))
    result = CliRunner().invoke(app, ["migrate"])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: KILN_DATABASE_PASSWORD_FILE={tmp_path / 'nope'}: no such file"
    assert result.exception is None or isinstance(result.exception, SystemExit)
