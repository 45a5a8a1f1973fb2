"""Where the CLI finds the API and its token.

Order of precedence: command-line flags, then ``KILN_API_URL`` / ``KILN_TOKEN``, then the config file
(``$XDG_CONFIG_HOME/kiln/config.json``, default ``~/.config/kiln/config.json``), then the local default URL.
The file holds a secret, so it is written atomically with mode 0600.

The file's top-level ``api_url`` and ``token`` are the default; ``profiles`` holds others by name, chosen with
``kiln --profile NAME`` or ``KILN_PROFILE`` (``kiln up`` adds one rather than overwrite another kiln's default).

These variables, and ``KILN_CLI_NAME`` (how the user runs the command, set by the ``./kiln`` wrapper of a fresh
clone), are the client's whole environment. They are not kiln's ``Settings`` (``core.settings``): those configure
the server's processes (database, broker, storage), which a laptop running the CLI has none of; the CLI reads
``Settings`` only in its server-side commands (``cli.server``).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_API_URL = "http://127.0.0.1:8421"
ENV_CLI_NAME = "KILN_CLI_NAME"  # the command as the user types it: ``./kiln`` from the wrapper, else ``kiln``


@dataclass(frozen=True)
class CliConfig:
    api_url: str
    token: str | None
    url_source: str  # "flag", "env", "file" or "default": said in error messages
    token_source: str


def config_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "kiln" / "config.json"


def load_file(path: Path | None = None) -> dict[str, Any]:
    path = path or config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object")
    return data


class ConfigError(Exception):
    pass


def save(api_url: str, token: str | None, path: Path | None = None, *, profile: str | None = None) -> Path:
    """Write the default entry, or the ``profile`` entry, keeping the rest of the file; atomically, readable by
    its owner only."""
    path = path or config_path()
    try:
        current = load_file(path)
    except ConfigError:
        current = {}
    entry: dict[str, Any] = {"api_url": normalize_url(api_url), "token": token}
    profiles = current.get("profiles") if isinstance(current.get("profiles"), dict) else None
    if profile is not None:
        data: dict[str, Any] = {**current, "profiles": {**(profiles or {}), profile: entry}}
    else:
        data = {**entry, **({"profiles": profiles} if profiles else {})}
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".config.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def normalize_url(url: str) -> str:
    """The API's base URL as the client joins paths to it: the URL ``kiln up`` prints (``.../v1``) and the bare
    one both work."""
    url = url.strip().rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url


def resolve(
    *,
    url_flag: str | None = None,
    token_flag: str | None = None,
    profile_flag: str | None = None,
    environ: dict[str, str] | None = None,
    path: Path | None = None,
) -> CliConfig:
    env = os.environ if environ is None else environ
    file = load_file(path or config_path(dict(env)))
    profile = profile_flag or env.get("KILN_PROFILE")
    if profile:
        found = file.get("profiles")
        profiles: dict[str, Any] = found if isinstance(found, dict) else {}
        if profile not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise ConfigError(f"no CLI profile {profile!r} in {path or config_path(dict(env))} (profiles: {known})")
        file = profiles[profile]
    url, url_source = _first((url_flag, "flag"), (env.get("KILN_API_URL"), "env"), (file.get("api_url"), "file"))
    url = url or DEFAULT_API_URL
    url_source = url_source if url_source != "none" else "default"
    token, token_source = _first((token_flag, "flag"), (env.get("KILN_TOKEN"), "env"), (file.get("token"), "file"))
    return CliConfig(normalize_url(url), token, url_source, token_source)


def _first(*candidates: tuple[object, str]) -> tuple[str | None, str]:
    """The first set value and where it came from, in order of precedence; (None, "none") when none is."""
    for value, source in candidates:
        if value:
            return str(value), source
    return None, "none"
