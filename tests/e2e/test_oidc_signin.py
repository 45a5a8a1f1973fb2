"""Sign-in with an OpenID provider, end to end against a real, certified one (panva's ``oidc-provider``, run with
node; tests/support/oidc_provider.py): the dashboard in Chromium (authorization code + PKCE through the provider's
own login page), the CLI's device flow (``./kiln login --sso``), the provider's groups mapped to kiln's teams and
roles, a group taken away taking effect at the next sign-in, and expired or tampered ID tokens refused.

    .venv/bin/pytest tests/e2e/test_oidc_signin.py -v
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.dashboard import ROOT, Kiln, chromium, running_kiln, screenshot_dir
from tests.support import oidc_provider
from tests.support.oidc_provider import CLI_CLIENT, Provider

pytestmark = pytest.mark.e2e

GROUP_MAP = {
    "ml-eng": "research:member",
    "ml-leads": "research:team-admin",
    "viewers": "research:viewer",
    "kiln-ops": "admin",
}
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


@dataclass
class World:
    kiln: Kiln
    provider: Provider


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("kiln-oidc")
    provider = oidc_provider.reserve(tmp)
    extra = {**provider.kiln_env(), "KILN_OIDC_GROUP_MAP": json.dumps(GROUP_MAP), "KILN_OIDC_CLOCK_SKEW_S": "0"}
    with running_kiln(tmp / "home", **extra) as kiln, oidc_provider.running(provider, redirect_uri=f"{kiln.url}/"):
        with kiln.api() as api:
            assert api.post("/v1/teams", json={"name": "research"}).status_code == 201
        yield World(kiln, provider)


def me(url: str, token: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def teams_of(url: str, token: str) -> dict[str, str]:
    return {m["team"]: m["role"] for m in me(url, token)["teams"]}


def provider_login(page: Any, user: str) -> None:
    """The provider's own login page (its development interactions: any password)."""
    page.wait_for_selector('input[name="login"]')
    page.fill('input[name="login"]', user)
    page.fill('input[name="password"]', "any password")
    page.click("button.login-submit")


def dashboard_sign_in(
    browser: Any, kiln: Kiln, user: str, context: Any = None, shot: Path | None = None
) -> tuple[Any, str]:
    """Sign in to the dashboard with the provider, as a person would; returns (page, kiln token it holds)."""
    context = context or browser.new_context()
    page = context.new_page()
    page.goto(f"{kiln.url}/")
    button = page.get_by_role("button", name="Sign in with your organisation")
    button.wait_for()
    if shot is not None:
        page.set_viewport_size({"width": 1280, "height": 700})
        page.screenshot(path=shot)
    button.click()
    if "127.0.0.1" in page.url and "/interaction/" in page.url or page.locator('input[name="login"]').count():
        provider_login(page, user)
    page.wait_for_selector("#queue-list table")
    assert "code=" not in page.url and "state=" not in page.url  # the code leaves the address bar
    token = page.evaluate("sessionStorage.getItem('kiln.token')")
    assert token and token.startswith("kiln_")
    return page, str(token)


def test_the_dashboard_signs_in_through_the_provider_and_groups_decide_teams(world: World) -> None:
    kiln, provider = world.kiln, world.provider
    provider.set_groups("alice", ["ml-eng", "unrelated-group"])
    provider.set_groups("bob", ["kiln-ops", "ml-leads"])
    with chromium() as browser:
        # The sign-in page as a person first sees it (docs/img with KILN_REFRESH_SCREENSHOTS=1).
        shot = screenshot_dir() / "dashboard-signin-sso.png"
        page, alice_token = dashboard_sign_in(browser, kiln, "alice", shot=shot)
        page.wait_for_function("document.getElementById('who-name')?.textContent === 'alice'")
        assert teams_of(kiln.url, alice_token) == {"research": "member"}
        assert me(kiln.url, alice_token)["is_admin"] is False

        _, bob_token = dashboard_sign_in(browser, kiln, "bob")
        assert teams_of(kiln.url, bob_token) == {"research": "team-admin"}
        assert me(kiln.url, bob_token)["is_admin"] is True
        r = httpx.get(f"{kiln.url}/v1/users", headers={"Authorization": f"Bearer {bob_token}"}, timeout=30)
        assert r.status_code == 200, r.text  # an admin's session carries the admin scope

        # The provider takes alice out of ml-eng and puts her in viewers; her next sign-in (same browser, the
        # provider's session still open) changes her role, and every token she holds follows at once.
        provider.set_groups("alice", ["viewers"])
        _, alice_again = dashboard_sign_in(browser, kiln, "alice", context=page.context)
        assert teams_of(kiln.url, alice_again) == {"research": "viewer"}
        assert teams_of(kiln.url, alice_token) == {"research": "viewer"}
        # Then out of every mapped group: she loses the team, and admin rights go the same way.
        provider.set_groups("alice", [])
        provider.set_groups("bob", ["ml-eng"])
        _, alice_last = dashboard_sign_in(browser, kiln, "alice", context=page.context)
        assert teams_of(kiln.url, alice_last) == {}
        r = httpx.get(f"{kiln.url}/v1/teams/research", headers={"Authorization": f"Bearer {alice_token}"})
        assert r.status_code == 404, r.text
        bob_page, bob_again = dashboard_sign_in(browser, kiln, "bob")
        assert me(kiln.url, bob_again)["is_admin"] is False
        assert teams_of(kiln.url, bob_again) == {"research": "member"}

        # Signing out ends the session: the token the sign-in issued is revoked, not merely forgotten.
        bob_page.get_by_role("button", name="Sign out").click()
        bob_page.wait_for_selector("#sso")
        r = httpx.get(f"{kiln.url}/v1/me", headers={"Authorization": f"Bearer {bob_again}"}, timeout=30)
        assert r.status_code == 401 and "revoked" in r.json()["detail"], r.text


def approve_device_code(browser: Any, verification_uri: str, user: str) -> None:
    """What the person does in a browser for a device sign-in: the code's page, Continue, log in, done."""
    page = browser.new_context().new_page()
    page.goto(verification_uri)
    page.get_by_role("button", name="Continue").click()
    provider_login(page, user)
    page.wait_for_selector("text=Sign-in Success")


def device_id_token(browser: Any, provider: Provider, user: str) -> str:
    """An ID token the provider signs for ``user`` through the device grant, fetched the way the CLI does."""
    doc = httpx.get(f"{provider.issuer}/.well-known/openid-configuration").json()
    start = httpx.post(
        doc["device_authorization_endpoint"], data={"client_id": CLI_CLIENT, "scope": "openid profile email groups"}
    ).json()
    approve_device_code(browser, start["verification_uri_complete"], user)
    form = {"grant_type": DEVICE_GRANT, "device_code": start["device_code"], "client_id": CLI_CLIENT}
    body = httpx.post(doc["token_endpoint"], data=form).json()
    assert "id_token" in body, body
    return str(body["id_token"])


def test_the_cli_signs_in_with_the_device_flow(world: World, tmp_path: Path) -> None:
    kiln, provider = world.kiln, world.provider
    provider.set_groups("carol", ["viewers"])
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "KILN_TOKEN": "", "KILN_API_URL": ""}
    proc = subprocess.Popen(
        [str(ROOT / "kiln"), "login", "--sso", "--url", kiln.url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    printed = ""
    while "enter the code" not in printed:  # ./kiln may first say it prepares the venv
        line = proc.stdout.readline()
        assert line, printed
        printed += line
    uri = re.search(r"open (\S+)", printed)
    code = re.search(r"enter the code (\S+)", printed)
    assert uri and code, printed
    with chromium() as browser:
        approve_device_code(browser, uri.group(1), "carol")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, printed + out
    assert f"logged in to {kiln.url} as carol" in out
    saved = json.loads((tmp_path / "kiln" / "config.json").read_text())
    assert saved["token"].startswith("kiln_")
    assert teams_of(kiln.url, saved["token"]) == {"research": "viewer"}
    whoami = subprocess.run([str(ROOT / "kiln"), "whoami"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert whoami.returncode == 0 and "carol" in whoami.stdout, whoami.stdout + whoami.stderr


def post_id_token(kiln: Kiln, id_token: str) -> httpx.Response:
    return httpx.post(f"{kiln.url}/v1/auth/oidc/id-token", json={"id_token": id_token}, timeout=30)


def refused(r: httpx.Response, words: str) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert words in r.json()["detail"], r.json()


def test_expired_and_tampered_id_tokens_are_refused(world: World) -> None:
    kiln, provider = world.kiln, world.provider
    provider.set_groups("dave", ["ml-eng"], id_token_ttl_s=1)
    provider.set_groups("erin", ["viewers"])
    with chromium() as browser:
        expired = device_id_token(browser, provider, "dave")
        good = device_id_token(browser, provider, "erin")
    time.sleep(2.5)
    refused(post_id_token(kiln, expired), "expired")

    header, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["groups"] = ["kiln-ops"]  # erin would make herself an admin
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    refused(post_id_token(kiln, f"{header}.{forged}.{signature}"), "signature")
    unsigned = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').decode().rstrip("=")
    refused(post_id_token(kiln, f"{unsigned}.{forged}."), "not a valid ID token")
    refused(post_id_token(kiln, "not-a-jwt"), "not a valid ID token")

    r = post_id_token(kiln, good)  # the same token untouched: accepted, as a viewer
    assert r.status_code == 201, r.text
    assert r.json()["teams"] == [{"team": "research", "role": "viewer"}] and r.json()["admin"] is False


def test_bad_sign_in_input_is_a_problem_not_a_traceback(world: World) -> None:
    kiln = world.kiln
    r = httpx.post(f"{kiln.url}/v1/auth/oidc/code", json={"code": "x", "code_verifier": "short", "nonce": "n"})
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
    body = {"code": "made-up", "code_verifier": "v" * 43, "redirect_uri": f"{kiln.url}/", "nonce": "n" * 16}
    r = httpx.post(f"{kiln.url}/v1/auth/oidc/code", json=body, timeout=30)
    refused(r, "the provider refused the sign-in code")


def test_the_cli_says_what_went_wrong_with_an_exit_code(tmp_path: Path) -> None:
    from harness.services import free_port

    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "KILN_TOKEN": ""}
    down = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run(
        [str(ROOT / "kiln"), "login", "--sso", "--url", down],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"{down} (connection refused)" in r.stderr and "Traceback" not in r.stderr
