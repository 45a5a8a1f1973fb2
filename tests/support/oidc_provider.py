"""A real OpenID provider for the sign-in tests: panva's ``oidc-provider`` (OpenID Certified), run with node from
``tests/support/oidc/provider.js``. Its node_modules are installed at test time (``npm ci`` from the lock file, into
the git-ignored ``tests/support/oidc/node_modules``), so a fresh clone needs nothing installed by hand but node."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.deps import missing
from harness.services import free_port, wait_until_serving

DIR = Path(__file__).resolve().parent / "oidc"
DASHBOARD_CLIENT, DASHBOARD_SECRET, CLI_CLIENT = "kiln-dashboard", "dashboard-secret", "kiln-cli"


def install() -> None:
    """``npm ci`` once per lock file (a file lock keeps two test processes from installing at once)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        missing("node and npm are missing (apt-get install -y nodejs npm): the sign-in tests run a real provider")
    stamp = DIR / "node_modules" / ".kiln-lock"
    lock = (DIR / "package-lock.json").read_text()
    with open(Path(tempfile.gettempdir()) / "kiln-oidc-npm.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == lock:
            return
        result = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            missing(f"npm ci in {DIR} failed: {result.stderr[-2000:]}")
        stamp.write_text(lock)


@dataclass
class Provider:
    issuer: str
    accounts: Path
    log: Path

    def set_groups(self, user: str, groups: list[str], *, id_token_ttl_s: int | None = None) -> None:
        """The user's groups at the provider from now on (read at each sign-in), and the lifetime of the ID
        tokens it signs for them (the provider's default, an hour, when None)."""
        data = json.loads(self.accounts.read_text())
        data[user] = {"groups": groups, **({"id_token_ttl_s": id_token_ttl_s} if id_token_ttl_s else {})}
        self.accounts.write_text(json.dumps(data))

    def kiln_env(self) -> dict[str, str]:
        return {
            "KILN_OIDC_ISSUER": self.issuer,
            "KILN_OIDC_CLIENT_ID": DASHBOARD_CLIENT,
            "KILN_OIDC_CLIENT_SECRET": DASHBOARD_SECRET,
            "KILN_OIDC_CLI_CLIENT_ID": CLI_CLIENT,
            "KILN_OIDC_SCOPES": "openid profile email groups",
        }


def reserve(tmp: Path) -> Provider:
    """A provider's address and accounts file, before it runs (kiln's settings name it; it names kiln's URL)."""
    accounts = tmp / "accounts.json"
    accounts.write_text("{}")
    return Provider(issuer=f"http://127.0.0.1:{free_port()}", accounts=accounts, log=tmp / "oidc-provider.log")


@contextmanager
def running(provider: Provider, *, redirect_uri: str) -> Iterator[Provider]:
    install()
    env = {
        **os.environ,
        "PORT": provider.issuer.rsplit(":", 1)[1],
        "REDIRECT_URI": redirect_uri,
        "ACCOUNTS": str(provider.accounts),
    }
    with open(provider.log, "wb") as log:
        proc = subprocess.Popen(
            ["node", str(DIR / "provider.js")], cwd=DIR, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_until_serving(f"{provider.issuer}/.well-known/openid-configuration", proc, timeout=30, log=provider.log)
        yield provider
    finally:
        proc.terminate()
        proc.wait(timeout=10)
