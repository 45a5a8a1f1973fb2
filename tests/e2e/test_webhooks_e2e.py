"""Webhooks end to end: the API, the scheduler process (its notifier thread) and a receiver as real processes.

The receiver (tests/support/webhook_receiver.py) verifies signatures as docs/notifications.md tells receivers to.
It is down while three jobs are cancelled, comes up, and gets all three, in order, each verified; a request
tampered with in transit and a replayed old one are refused by the same check. Then the dashboard shows the
delivery log in Chromium.

    .venv/bin/pytest tests/e2e/test_webhooks_e2e.py -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.webhooks import SIGNATURE_HEADER, sign
from harness.dashboard import ROOT, Kiln, chromium, running_kiln, screenshot_dir
from harness.services import free_port
from harness.workers_cluster import wait_for
from tests.support.api import spec

pytestmark = pytest.mark.e2e


SCHEDULER_METRICS_PORT = free_port()


@pytest.fixture(scope="module")
def kiln(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kiln]:
    env = {
        "KILN_WEBHOOK_ALLOW_PRIVATE_TARGETS": "1",
        "KILN_WEBHOOK_BACKOFF_BASE_S": "0.3",
        "KILN_WEBHOOK_BACKOFF_MAX_S": "1",
        "KILN_WEBHOOK_POLL_S": "0.2",
        "KILN_SCHEDULER_METRICS_PORT": str(SCHEDULER_METRICS_PORT),
    }
    with running_kiln(tmp_path_factory.mktemp("kiln-webhooks"), **env) as k:
        k.start_scheduler()
        yield k


def _records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="module")
def delivered(kiln: Kiln, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The hook whose deliveries the first test saw through; the dashboard test reads its log."""
    return {}


def test_a_receiver_down_for_a_while_gets_every_delivery_in_order(
    kiln: Kiln, tmp_path: Path, delivered: dict[str, Any]
) -> None:
    port = free_port()  # nothing listens there yet: the receiver is down
    api = kiln.api()
    hook = api.post(
        "/v1/webhooks",
        json={"team": "default", "url": f"http://127.0.0.1:{port}/kiln", "events": ["cancelled", "failed"]},
    ).json()
    slack = api.post(
        "/v1/webhooks",
        json={"team": "default", "url": f"http://127.0.0.1:{port}/slack", "events": ["cancelled"], "format": "slack"},
    ).json()
    jobs = []
    for i in range(3):
        r = api.post("/v1/jobs", json=spec(team="default", name=f"hooked-{i}"))
        assert r.status_code == 201, r.text
        jobs.append(r.json()["id"])
    for job in jobs:
        assert api.post(f"/v1/jobs/{job}/cancel").status_code == 202

    def log_of(hook_id: int) -> list[dict[str, Any]]:
        return list(reversed(api.get(f"/v1/webhooks/{hook_id}/deliveries").json()["items"]))

    # Down: the first delivery is retried with backoff, the later ones wait behind it.
    wait_for(lambda: (d := log_of(hook["id"])) and d[0]["attempts"] >= 3, 60, "three failed attempts")
    head, *rest = log_of(hook["id"])
    assert head["status"] == "pending" and "ConnectError" in head["last_error"]
    assert all(d["attempts"] == 0 for d in rest), rest

    # Up: everything arrives, in order, verified.
    received = tmp_path / "received.jsonl"
    secrets = {"/kiln": hook["secret"], "/slack": slack["secret"]}
    receiver = subprocess.Popen(
        [sys.executable, "-m", "tests.support.webhook_receiver", str(port), str(received)],
        cwd=ROOT,
        env={**os.environ, "KILN_TEST_WEBHOOK_SECRETS": json.dumps(secrets)},
    )
    try:
        wait_for(
            lambda: all(d["status"] == "delivered" for d in log_of(hook["id"]) + log_of(slack["id"])),
            60,
            f"every delivery; scheduler log:\n{kiln.log('scheduler')}",
        )
        kiln_records = [r for r in _records(received) if r["path"] == "/kiln"]
        assert [json.loads(r["body"])["job"]["id"] for r in kiln_records] == jobs
        assert all(r["verified"] and r["event"] == "cancelled" for r in kiln_records)
        assert [json.loads(r["body"])["kind"] for r in kiln_records] == ["cancelled"] * 3
        slack_texts = [json.loads(r["body"])["text"] for r in _records(received) if r["path"] == "/slack"]
        assert slack_texts[0].startswith(f"kiln: job {jobs[0]} (hooked-0, team default) cancelled: cancelled by admin")
        assert log_of(hook["id"])[0]["attempts"] >= 4 and log_of(hook["id"])[0]["last_status_code"] == 200

        # The receiver's check refuses a body changed in transit, and an old request replayed.
        first = kiln_records[0]
        url = f"http://127.0.0.1:{port}/kiln"
        tampered = first["body"].replace('"cancelled"', '"finished"', 1)
        assert tampered != first["body"]
        headers = {SIGNATURE_HEADER: first["signature"], "Content-Type": "application/json"}
        assert httpx.post(url, content=tampered, headers=headers).status_code == 401
        old = sign(hook["secret"], int(time.time()) - 3600, first["body"].encode())
        assert httpx.post(url, content=first["body"], headers={SIGNATURE_HEADER: old}).status_code == 401
        fresh = sign(hook["secret"], int(time.time()), first["body"].encode())
        assert httpx.post(url, content=first["body"], headers={SIGNATURE_HEADER: fresh}).status_code == 200
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
    delivered["hook_id"] = hook["id"]

    # The scheduler process's own listener counts what its notifier did, and its cycles.
    scraped = httpx.get(f"http://127.0.0.1:{SCHEDULER_METRICS_PORT}/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in scraped.splitlines() if line[:1] != "#"}
    assert values['kiln_webhook_deliveries_total{outcome="delivered"}'] == 6  # 3 jobs x 2 hooks
    assert values['kiln_webhook_deliveries_total{outcome="retry"}'] >= 3
    assert values["kiln_scheduler_leader"] == 1 and values["kiln_scheduler_cycle_seconds_count"] >= 1


def test_the_dashboard_shows_the_delivery_log(kiln: Kiln, delivered: dict[str, Any]) -> None:
    assert "hook_id" in delivered, "runs after the delivery test (same module)"
    hook = {"id": delivered["hook_id"]}
    with chromium() as browser:
        from playwright.sync_api import expect

        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{kiln.url}/")
        page.get_by_label("API token").fill(kiln.token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector("#queue-list table")
        page.get_by_role("link", name="Webhooks", exact=True).click()
        expect(page.locator("#webhooks tbody tr")).to_have_count(2)
        assert "null" not in page.locator("main").inner_text()
        page.get_by_role("link", name=str(hook["id"]), exact=True).click()
        rows = page.locator("#deliveries tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.first.locator(".badge")).to_have_text("delivered")
        expect(page.locator("#deliveries")).to_contain_text("cancelled")
        page.screenshot(path=str(screenshot_dir() / "dashboard-webhooks-deliveries.png"), full_page=True)
        assert not errors, errors
