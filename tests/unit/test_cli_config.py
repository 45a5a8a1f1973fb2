"""Config file location, precedence (flag > env > file > default) and its 0600 mode."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from cli.config import DEFAULT_API_URL, ConfigError, config_path, load_file, normalize_url, resolve, save


def test_xdg_config_home_is_respected(tmp_path: Path) -> None:
    assert config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "kiln" / "config.json"
    assert config_path({"XDG_CONFIG_HOME": "relative/ignored"}) == Path.home() / ".config" / "kiln" / "config.json"


def test_save_is_owner_only_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "kiln" / "config.json"
    save("127.0.0.1:9000/", "kiln_secret", path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"api_url": "http://127.0.0.1:9000", "token": "kiln_secret"}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".config.")]  # no temp file left


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    assert resolve(environ={}, path=path).api_url == DEFAULT_API_URL
    save("http://file:1", "file-token", path)
    cfg = resolve(environ={}, path=path)
    assert (cfg.api_url, cfg.token, cfg.url_source, cfg.token_source) == ("http://file:1", "file-token", "file", "file")
    env = {"KILN_API_URL": "http://env:2", "KILN_TOKEN": "env-token"}
    cfg = resolve(environ=env, path=path)
    assert (cfg.api_url, cfg.token) == ("http://env:2", "env-token")
    cfg = resolve(url_flag="http://flag:3", token_flag="flag-token", environ=env, path=path)
    assert (cfg.api_url, cfg.token, cfg.url_source) == ("http://flag:3", "flag-token", "flag")


def test_unreadable_config_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        load_file(path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_file(path)


def test_normalize_url() -> None:
    assert normalize_url(" https://kiln.example.com/ ") == "https://kiln.example.com"
    assert normalize_url("localhost:8421") == "http://localhost:8421"
    # what `kiln up` prints (the API's /v1 URL) works as --api-url, as does the bare one
    assert (
        normalize_url("http://127.0.0.1:8421/v1")
        == normalize_url("http://127.0.0.1:8421/v1/")
        == ("http://127.0.0.1:8421")
    )
