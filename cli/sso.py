"""``kiln login --sso``: the device authorization grant (RFC 8628) with the OpenID provider kiln names
(``GET /v1/auth/oidc``), then the provider's ID token exchanged for a kiln token (``POST /v1/auth/oidc/id-token``),
which kiln checks (signature, issuer, audience, expiry) and maps to teams and roles. The CLI is a public client: it
holds no secret, and it never reads the ID token itself."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cli.client import KilnClient
from cli.config import CliConfig
from cli.errors import CliError, ExitCode

GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def sign_in(url: str, say: Callable[[str], None]) -> dict[str, Any]:
    """The kiln API's answer to a device sign-in (its ``secret`` is the new token); ``say`` shows the user where
    to go and which code to enter."""
    with KilnClient(CliConfig(url, None, "flag", "flag")) as api:
        config = api.get("/v1/auth/oidc")
        if not config.get("enabled"):
            off = f"{url} signs no one in with a provider (its admin sets KILN_OIDC_ISSUER); use `kiln login --token`"
            raise CliError(off, ExitCode.NOT_FOUND)
        endpoint = config.get("device_authorization_endpoint")
        if not endpoint:
            raise CliError(f"the provider {config.get('issuer')} offers no device sign-in", ExitCode.INVALID)
        start = _post(endpoint, {"client_id": config["cli_client_id"], "scope": config["scopes"]})
        if "device_code" not in start:
            raise CliError(f"the provider refused a device sign-in: {_why(start)}", ExitCode.UNAUTHORIZED)
        say(
            f"To sign in, open {start.get('verification_uri_complete') or start['verification_uri']}\n"
            f"and enter the code {start['user_code']} (waiting up to {int(start.get('expires_in', 600))} s)"
        )
        id_token = _poll(config, start)
        answer = api.post("/v1/auth/oidc/id-token", json={"id_token": id_token})
    return answer if isinstance(answer, dict) else {}


def _poll(config: dict[str, Any], start: dict[str, Any]) -> str:
    """The ID token once the user has approved (RFC 8628 section 3.4: wait ``interval``, slower on slow_down)."""
    interval = float(start.get("interval", 5))
    deadline = time.monotonic() + float(start.get("expires_in", 600))
    form = {"grant_type": GRANT, "device_code": start["device_code"], "client_id": config["cli_client_id"]}
    while time.monotonic() < deadline:
        time.sleep(interval)
        body = _post(config["token_endpoint"], form)
        if "id_token" in body:
            return str(body["id_token"])
        error = body.get("error")
        if error == "slow_down":
            interval += 5
        elif error != "authorization_pending":
            code = ExitCode.UNAUTHORIZED if error in ("access_denied", "expired_token") else ExitCode.FAILURE
            raise CliError(f"sign-in failed: {_why(body)}", code)
    expired = "sign-in failed: the code expired before it was entered; run `kiln login --sso` again"
    raise CliError(expired, ExitCode.UNAUTHORIZED)


def _post(url: str, form: dict[str, str]) -> dict[str, Any]:
    import httpx

    try:
        response = httpx.post(url, data=form, timeout=30, headers={"Accept": "application/json"})
        body = response.json()
    except httpx.HTTPError as exc:
        raise CliError(f"the OpenID provider at {url} cannot be reached: {exc}", ExitCode.UNREACHABLE) from None
    except ValueError:
        raise CliError(f"the OpenID provider at {url} did not answer JSON", ExitCode.SERVER) from None
    return body if isinstance(body, dict) else {}


def _why(body: dict[str, Any]) -> str:
    return str(body.get("error_description") or body.get("error") or "no reason given")
