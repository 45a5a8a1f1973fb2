"""The compile cache's reuse on the dashboard, in a real browser (Debian's Chromium through Playwright) against the
real API: the job page says each attempt's compile (hit or miss, source, key, time saved, rejections) and the cost
page each team's hit rate and time saved over its window, and how far the forecasts for its jobs were from what
happened, as the job page shows each of a job's own.

The trainer's compile events of five attempts are written by the worker's own relay (workers.telemetry_relay) into
the API's database (tests/support/compile_events.py): compiling for real takes minutes on a CPU.

    .venv/bin/pytest tests/e2e/test_dashboard_compile_cache.py -v
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from core.db import make_engine, utcnow
from core.models import Job
from core.services.forecasts import record_forecast
from harness.dashboard import Kiln, chromium, running_kiln, screenshot_dir, signed_in_page
from tests.support.compile_events import SUMMARIES, relay_compiles

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-tiny.yaml"


@pytest.fixture(scope="module")
def kiln(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kiln]:
    with running_kiln(tmp_path_factory.mktemp("kiln-compile-cache")) as k:
        yield k


@pytest.fixture(scope="module")
def job_id(kiln: Kiln) -> int:
    """A job that compiles (``mode: auto``), with its attempts' compile events relayed."""
    body = EXAMPLE.read_text().replace('mode: "off"', "mode: auto")
    with kiln.api() as client:
        r = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/yaml"})
        assert r.status_code == 201, r.text
        job_id = int(r.json()["id"])
    engine = make_engine(kiln.env["KILN_DATABASE_URL"])
    with Session(engine) as db:
        job = db.get(Job, job_id)
        assert job is not None
        relay_compiles(db, job)
        db.commit()
    engine.dispose()
    return job_id


@pytest.fixture
def page(kiln: Kiln) -> Iterator[Any]:
    with chromium() as browser:
        pg = signed_in_page(browser, kiln.url, kiln.token)
        problems: list[str] = []
        pg.on("pageerror", lambda e: problems.append(f"script error: {e}"))
        yield pg
        assert not problems, problems


def test_job_page_says_each_attempts_compile(page: Any, kiln: Kiln, job_id: int) -> None:
    from playwright.sync_api import expect

    page.goto(f"{kiln.url}/#/jobs/{job_id}")
    items = page.locator("#compile-cache li")
    expect(items).to_have_text([f"Attempt {n}: {s}" for n, s in enumerate(SUMMARIES, start=1)])
    expect(items.nth(2)).to_have_attribute("data-status", "hit")
    # The cache's own events are the attempts' compiles, not compile fallbacks.
    expect(page.locator("#health")).to_contain_text("Compile fallbacks: none")
    page.locator("#compile-cache").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir() / "dashboard-job-compile-cache.png"))


def test_cost_page_shows_the_teams_hit_rate_and_time_saved(page: Any, kiln: Kiln, job_id: int) -> None:
    from playwright.sync_api import expect

    page.goto(f"{kiln.url}/#/cost")
    row = page.locator("#compile-cache tbody tr")
    # default: 4 compiles, 2 hits (team cache), 21.3 s saved by the one hit that said, 1 entry rejected.
    expect(row).to_have_count(1)
    expect(row.locator("td")).to_have_text(["default", "4", "2", "50.0%", "21s", "1"])
    page.get_by_label("Window").select_option(index=0)  # the shortest window: the events are minutes old
    expect(row.locator("td").nth(3)).to_have_text("50.0%")
    page.screenshot(path=str(screenshot_dir() / "dashboard-cost-compile-cache.png"))


@pytest.fixture(scope="module")
def forecasts(kiln: Kiln, job_id: int) -> int:
    """The scheduler's start forecast and the trainer's memory prediction for the job, settled against what it
    measured: started 4 minutes after the earliest forecast, 10 MB more memory than forecast."""
    engine = make_engine(kiln.env["KILN_DATABASE_URL"])
    with Session(engine) as db:
        job = db.get(Job, job_id)
        assert job is not None
        start = record_forecast(db, job=job, kind="start_time", source="scheduler", predicted=60, predicted_high=600)
        memory = record_forecast(db, job=job, kind="peak_memory", source="trainer", predicted=100e6)
        (start.actual, start.settled_at), (memory.actual, memory.settled_at) = (300, utcnow()), (110e6, utcnow())
        db.commit()
    engine.dispose()

    return job_id


def test_cost_page_shows_how_far_the_forecasts_were_from_what_happened(page: Any, kiln: Kiln, forecasts: int) -> None:
    from playwright.sync_api import expect

    page.goto(f"{kiln.url}/#/cost")
    rows = page.locator("#forecasts tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td")).to_have_text(
        ["start time", "scheduler", "1", "0", "1", "4m 0s", "4m 0s", "+4m 0s", "—", "—", "1/1"]
    )
    expect(rows.nth(1).locator("td")).to_have_text(
        ["peak memory", "trainer", "1", "0", "1", "10.0 MB", "10.0 MB", "+10.0 MB", "9.1%", "9.1%", "—"]
    )
    page.locator("#forecasts").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir() / "dashboard-cost-forecasts.png"))


def test_job_page_sets_each_forecast_against_what_happened(page: Any, kiln: Kiln, forecasts: int) -> None:
    from playwright.sync_api import expect

    page.goto(f"{kiln.url}/#/jobs/{forecasts}")
    rows = page.locator("#job-forecasts tbody tr")
    expect(rows).to_have_count(2)
    start = rows.filter(has_text="Start").locator("td")
    expect(start.nth(1)).to_have_text("scheduler")
    expect(start.nth(2)).to_contain_text(" to ")  # the earliest and latest start, as times
    expect(start.nth(4)).to_have_text("+4m 0s")
    expect(rows.filter(has_text="Peak memory").locator("td")).to_have_text(
        ["Peak memory per rank", "trainer", "100.0 MB", "110.0 MB", "+10.0 MB (9.1%)"]
    )
    page.locator("#job-forecasts").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir() / "dashboard-job-forecasts.png"))
