"""Passwords from files (Docker or Kubernetes secrets) put into the database and broker URLs.

The URL in the environment names the user, the host and the database (nothing secret); the password comes from a
file that holds it alone: ``KILN_DATABASE_PASSWORD_FILE``, ``KILN_BROKER_PASSWORD_FILE``. One file then serves the
server and its clients alike (the PostgreSQL image reads the same file through ``POSTGRES_PASSWORD_FILE``), so a
password is written once, never into an environment variable, a compose file or a process's command line.

Standard library only: the CLI imports :class:`SecretError` at start-up to report it as one line.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit


class SecretError(Exception):
    """A secret file is missing, unreadable or empty, or cannot go into its URL (said with the variable's name).

    Not a ValueError on purpose: pydantic would wrap a ValueError raised while validating the settings into a
    ValidationError of several lines; this one reaches the process's error reporting as it is.
    """


def read_secret(path: Path, name: str) -> str:
    """The password in ``path``: the file's text without its trailing newlines, as a shell's ``$(cat file)`` and
    the PostgreSQL image's ``POSTGRES_PASSWORD_FILE`` read it (so kiln and the server agree on the password)."""
    try:
        value = path.read_text().rstrip("\n")
    except FileNotFoundError:
        raise SecretError(f"{name}={path}: no such file") from None
    except OSError as exc:
        raise SecretError(f"{name}={path}: cannot be read ({exc.strerror or exc})") from None
    if not value:
        raise SecretError(f"{name}={path}: the file is empty")
    return value


def with_password(url: str, password: str, name: str) -> str:
    """``url`` with ``password`` in it (percent-encoded), for URLs of the form ``scheme://[user]@host[:port]/...``.

    A URL that already carries another password is refused: two sources for one secret hide which one is used.
    """
    parts = urlsplit(url)
    if not parts.hostname:
        raise SecretError(f"{name} is set, but the URL it completes names no server: {parts.scheme or url}://...")
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, has_password, current = userinfo.partition(":")
    if has_password and unquote(current) != password:
        raise SecretError(f"{name} is set, and the URL it completes carries another password: keep one of the two")
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{hostport}"))
