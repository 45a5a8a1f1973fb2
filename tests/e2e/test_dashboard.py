"""The dashboard in a real browser (Debian's Chromium through Playwright) against the real system.

1. Sign in, validation errors beside the field (form and YAML), submit through the form, the job queues up with
   its position and wait against the contract (API alone: nothing admits it yet); it is held.
2. The scheduler and a worker start: the held job stays queued until released; it runs, loss/throughput points
   appear, logs follow, cancel stops it.
3. Every page at 1280x800 and at a phone width (375px): screenshots (into docs/img/ only with
   KILN_REFRESH_SCREENSHOTS=1, else a temp dir), labels on every control, no horizontal overflow of the page,
   no failed request or script error.

    .venv/bin/pytest tests/e2e/test_dashboard.py -v
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.dashboard import Kiln, chromium, running_kiln, screenshot_dir

pytestmark = pytest.mark.e2e

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 740}
PAGES = ["queue", "job", "submit", "sweeps", "teams", "sla", "cluster", "cost", "webhooks"]


@pytest.fixture(scope="module")
def kiln(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kiln]:
    with running_kiln(tmp_path_factory.mktemp("kiln-e2e")) as k:
        yield k


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, kiln: Kiln) -> Iterator[Any]:
    context = browser.new_context(viewport=DESKTOP)
    pg = context.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    # Every request stays on the API's origin: nothing is fetched from elsewhere at run time.
    pg.on(
        "request",
        lambda r: problems.append(f"external request: {r.url}") if not r.url.startswith((kiln.url, "data:")) else None,
    )
    pg.problems = problems
    yield pg
    context.close()
    assert not problems, problems


def sign_in(page: Any, kiln: Kiln) -> None:
    page.goto(f"{kiln.url}/")
    page.get_by_label("API token").fill(kiln.token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#queue-list table")


def test_sign_in_validation_submit_and_queue(page: Any, kiln: Kiln) -> None:
    from playwright.sync_api import expect

    # A wrong token is refused on the sign-in page itself.
    page.goto(f"{kiln.url}/")
    expect(page).to_have_url(re.compile(r"#/signin"))
    page.get_by_label("API token").fill("kiln_not-a-real-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#token-error")).to_contain_text("not valid")

    sign_in(page, kiln)
    expect(page.locator("#who-name")).to_have_text("admin (admin)")

    # The form: the API's problem+json errors land beside the fields they name.
    page.get_by_role("link", name="Submit", exact=True).click()
    page.get_by_label("Name", exact=True).fill("Not A Valid Name!")
    page.get_by_label("Steps", exact=True).fill("0")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#f-name-error")).to_contain_text("lowercase letters, digits")
    expect(page.locator("#f-steps-error")).to_contain_text("greater than or equal to 1")
    expect(page.get_by_label("Name", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#f-time-limit-s-error")).to_be_empty()  # only the fields at fault
    expect(page).to_have_url(re.compile(r"#/submit"))  # nothing was submitted

    # The YAML editor: the error names the field path and the line that holds it.
    page.get_by_role("button", name="YAML editor").click()
    yaml_box = page.get_by_label("Job spec (YAML)")
    yaml_box.fill(yaml_box.input_value().replace("  gpus: 0", "  gpus: -2"))
    page.get_by_role("button", name="Submit YAML").click()
    error = page.locator("#yaml-errors li[data-loc='resources.gpus']")
    expect(error).to_contain_text("line 13")
    expect(error).to_contain_text("greater than or equal to 0")

    # Fixed, through the form: the job page opens, and the job waits in the queue.
    page.get_by_role("button", name="Form").click()
    page.get_by_label("Name", exact=True).fill("e2e-gpt")
    page.get_by_label("Steps", exact=True).fill("100000")  # long enough to be watched running, then cancelled
    page.get_by_label("Checkpoint every (steps)").fill("50")
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(re.compile(r"#/jobs/\d+$"))
    expect(page.locator("#job-state")).to_have_attribute("data-state", "QUEUED")
    expect(page.locator("#timeline")).to_contain_text("SUBMITTED")
    job_id = int(page.url.rsplit("/", 1)[1])
    # Held, it will not start when the scheduler comes (the next test releases it).
    page.get_by_role("button", name="Hold").click()
    expect(page.get_by_role("button", name="Release")).to_be_visible()
    expect(page.locator("#job-facts")).to_contain_text("Held: held by admin")
    expect(page.locator("#timeline")).to_contain_text("HELD")
    # the expected start, as kiln why says it (the same endpoint)
    expect(page.locator("#expected-start")).to_have_text(
        "cannot be known: it is held: it starts only after it is released"
    )

    # Changed from its page, as `kiln update` changes it: what cannot be read, and what the API refuses, is said
    # beside the field; the rest is saved, and the facts and the timeline follow.
    page.get_by_role("button", name="Edit").click()
    dialog = page.locator("#edit-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_label("QoS class")).to_have_value("silver")
    dialog.get_by_label("Time limit").fill("soon")
    dialog.get_by_role("button", name="Save").click()
    expect(page.locator("#edit-time-limit-s-error")).to_contain_text("not a duration")
    dialog.get_by_label("Time limit").fill("2h")
    dialog.get_by_label("QoS class").select_option("bronze")
    dialog.get_by_label("Depends on").fill(str(job_id))
    dialog.get_by_role("button", name="Save").click()
    expect(page.locator("#edit-depends-on-error")).to_contain_text("itself")
    expect(page.locator("#edit-time-limit-s-error")).to_be_empty()
    page.screenshot(path=str(screenshot_dir() / "dashboard-job-edit.png"))
    dialog.get_by_label("Depends on").fill("")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("#job-facts")).to_contain_text("bronze")
    expect(page.locator("#job-facts")).to_contain_text("2h 0m")
    expect(page.locator("#timeline")).to_contain_text("qos silver -> bronze; time_limit none -> 7200 s")

    page.get_by_role("link", name="Queue", exact=True).click()
    row = page.locator("#queue-list tbody tr", has=page.locator(f"a[href='#/jobs/{job_id}']"))
    expect(row).to_contain_text("e2e-gpt")
    expect(row.locator("td").first).to_have_text("—")  # held: no position in the line
    expect(row).to_contain_text("Held")
    expect(row).to_contain_text("/ 10m 0s")  # wait so far against the contract's maximum (600 s)
    page.get_by_label("Submitted").select_option("1h")  # a window rolling with each refresh
    expect(page).to_have_url(re.compile(r"since=1h"))
    expect(row).to_contain_text("e2e-gpt")
    expect(page.locator("#summary-title + .table-wrap")).to_contain_text("bronze")


def test_job_runs_live_logs_and_cancel(page: Any, kiln: Kiln) -> None:
    from playwright.sync_api import expect

    with kiln.api() as client:
        jobs = client.get("/v1/jobs", params={"name": "e2e-gpt"}).json()["items"]
    assert jobs, "the first test submits the job"
    job_id = jobs[0]["id"]

    kiln.start_worker()
    kiln.start_scheduler()
    sign_in(page, kiln)
    page.goto(f"{kiln.url}/#/jobs/{job_id}")
    try:
        # Held by the first test: with a worker's host up and the scheduler cycling every 0.5 s, it stays queued
        # until the Release button lets it go.
        with kiln.api() as client:
            deadline = time.monotonic() + 120
            while not client.get("/v1/cluster/hosts").json()["items"] and time.monotonic() < deadline:
                time.sleep(0.5)
        time.sleep(3)
        expect(page.locator("#job-state")).to_have_attribute("data-state", "QUEUED")
        page.get_by_role("button", name="Release").click()
        expect(page.locator("#timeline")).to_contain_text("RELEASED")
        expect(page.locator("#job-state")).to_have_attribute("data-state", "RUNNING", timeout=120_000)
        # Plot points appear as the trainer reports steps (SSE, or polling as the fallback).
        expect(page.locator("figure[data-chart='loss']")).not_to_have_attribute(
            "data-points", re.compile(r"^[0-2]$"), timeout=120_000
        )
        expect(page.locator("figure[data-chart='loss']")).to_have_attribute("data-series", "1")
        expect(page.locator("figure[data-chart='throughput']")).not_to_have_attribute("data-points", "0")
        # Logs follow.
        expect(page.locator("#logs")).not_to_be_empty(timeout=60_000)
        # Both live streams hold (SSE, not the polling fallback), opened with stream tickets: the API's access log
        # has the tickets and never the token.
        expect(page.locator("#live-mode")).to_have_text("live")
        expect(page.locator("#log-status")).to_have_text("streaming")
        # Running, its time limit only can change (the admin may raise it); its worker follows at its next heartbeat.
        page.get_by_role("button", name="Edit").click()
        dialog = page.locator("#edit-dialog")
        expect(dialog.get_by_label("QoS class")).to_be_hidden()
        expect(dialog.get_by_label("Time limit")).to_have_value("2h")
        dialog.get_by_label("Time limit").fill("1d")
        dialog.get_by_role("button", name="Save").click()
        expect(dialog).to_be_hidden()
        expect(page.locator("#timeline")).to_contain_text("time_limit 7200 s -> 86400 s")
        expect(page.locator("#job-facts")).to_contain_text("1d 0h")
        access_log = kiln.log("api", tail=10**8)
        assert "/stream?after_id=0&ticket=kst_" in access_log and "/logs?follow=true&ticket=kst_" in access_log
        assert kiln.token not in access_log and "access_token" not in access_log
        page.screenshot(path=str(screenshot_dir() / "dashboard-job-running.png"))
        page.set_viewport_size(PHONE)
        page.screenshot(path=str(screenshot_dir() / "dashboard-job-running-phone.png"))
        page.set_viewport_size(DESKTOP)

        page.once("dialog", lambda d: d.accept())
        page.get_by_role("button", name="Cancel job").click()
        expect(page.locator("#job-state")).to_have_attribute("data-state", "CANCELLED", timeout=90_000)
        expect(page.locator("#timeline")).to_contain_text("CANCELLED")
    except AssertionError as exc:
        logs = "\n".join(f"--- {n}.log\n{kiln.log(n)}" for n in ("scheduler", "worker"))
        raise AssertionError(f"{exc}\n{logs}") from exc


def submit_examples(kiln: Kiln) -> int:
    """A few jobs in different QoS classes through the API (so the pages have something to show); returns the
    oldest job's id."""
    example = (Path(__file__).resolve().parents[2] / "examples" / "gpt-tiny.yaml").read_text()
    with kiln.api() as client:
        items = client.get("/v1/jobs", params={"limit": 10}).json()["items"]
        if len(items) < 4:
            for i, qos in enumerate(("gold", "bronze", "best-effort")):
                body = example.replace("name: gpt-tiny", f"name: sample-{i}").replace("qos: silver", f"qos: {qos}")
                r = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/yaml"})
                assert r.status_code == 201, r.text
            items = client.get("/v1/jobs", params={"limit": 10}).json()["items"]
    return min(j["id"] for j in items)


LABEL_CHECK = """() => [...document.querySelectorAll('main input, main select, main textarea, main button')]
  .filter((el) => !el.closest('[hidden]'))
  .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.textContent.trim())
  .map((el) => el.outerHTML.slice(0, 120))"""


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_every_page_screenshots_labels_and_fit(page: Any, kiln: Kiln, viewport: str) -> None:
    from playwright.sync_api import expect

    size = DESKTOP if viewport == "desktop" else PHONE
    page.set_viewport_size(size)
    job_id = submit_examples(kiln)
    sign_in(page, kiln)
    suffix = "" if viewport == "desktop" else "-phone"
    for name in PAGES:
        page.goto(f"{kiln.url}/#/{'jobs/' + str(job_id) if name == 'job' else name}")
        expect(page.locator("h1")).to_be_visible()
        page.wait_for_timeout(800)  # let the page's requests settle (the job page streams: no networkidle)
        assert page.evaluate(LABEL_CHECK) == [], f"unlabelled controls on {name}"
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name} overflows the {size['width']}px viewport by {overflow}px"
        page.screenshot(path=str(screenshot_dir() / f"dashboard-{name}{suffix}.png"))

    # Keyboard: after a navigation the focus is on the page's heading; Shift+Tab walks back through the header
    # (sign out, then the navigation); Enter follows a link and the new page's heading takes the focus.
    page.goto(f"{kiln.url}/#/queue")
    expect(page.locator("h1")).to_be_focused()
    nav_link = page.locator("#nav a[data-nav='cost']")
    for _ in range(6):
        page.keyboard.press("Shift+Tab")
        if nav_link.evaluate("(el) => el === document.activeElement"):
            break
    expect(nav_link).to_be_focused()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"#/cost$"))
    expect(page.locator("h1")).to_have_text("Cost")
    expect(page.locator("h1")).to_be_focused()
    # The skip link is the first stop of the document and is shown when focused.
    page.locator(".skip-link").focus()
    assert page.locator(".skip-link").bounding_box()["x"] >= 0
