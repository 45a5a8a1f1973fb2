"""The dashboard's charts (uPlot, vendored under frontend/vendor/uplot) and the job timeline, in a real browser
(Debian's Chromium through Playwright) against the real API, on telemetry and events written into its database
(training for real takes minutes on a CPU).

- the timeline shows the newest event first: how the job ended is never below the fold of its box;
- a chart's y ticks enclose every point, and a one-point axis reads distinct round ticks (never `99 99.5 100 101 101`);
- a sweep of 24 jobs draws 24 distinct colours;
- hovering shows each series' value in the legend; dragging across zooms in, a double-click zooms out;
- throughput is in the recipe's unit: tokens/s for the GPT, samples/s for the MLP;
- the SLA page lists one queue-wait violation per job (not the evaluator's 601 s beside the 622 s counted), and
  draws each bucket across its span over the whole window (a 7-day window with jobs on one day is no dot).

    .venv/bin/pytest tests/e2e/test_dashboard_charts.py -v
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.orm import Session

from core.db import make_engine, utcnow
from core.models import Event, Job, JobMetric
from harness.dashboard import Kiln, chromium, running_kiln, screenshot_dir, signed_in_page

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-tiny.yaml"
SWEEP_JOBS = 24

# The chart's uPlot instance (chart.js sets figure.chart): its y ticks, as drawn, and the data's extent.
Y_AXIS = """(fig) => {
  const u = fig.chart.plot;
  const ys = u.data.slice(1).flat().filter((v) => v !== null && v !== undefined);
  return { splits: u.axes[1]._splits, labels: u.axes[1]._values, lo: Math.min(...ys), hi: Math.max(...ys) };
}"""


@pytest.fixture(scope="module")
def kiln(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kiln]:
    with running_kiln(tmp_path_factory.mktemp("kiln-charts")) as k:
        yield k


def submit(kiln: Kiln, doc: dict[str, Any], path: str = "/v1/jobs") -> dict[str, Any]:
    with kiln.api() as client:
        r = client.post(path, json=doc)
        assert r.status_code == 201, r.text
        return dict(r.json())


def spec(name: str, **changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    return {**doc, "name": name, **changes}


def database(kiln: Kiln) -> Session:
    return Session(make_engine(kiln.env["KILN_DATABASE_URL"]))


@pytest.fixture(scope="module")
def ended_job(kiln: Kiln) -> int:
    """A GPT job that ran 60 steps, checkpointed 30 times and succeeded: 33 events, the last SUCCEEDED."""
    job_id = int(submit(kiln, spec("charted"))["id"])
    now = utcnow()
    with database(kiln) as db:
        job = db.get(Job, job_id)
        assert job is not None
        for step in range(1, 61):
            db.add(
                JobMetric(
                    job_id=job_id,
                    step=step,
                    ts=now - timedelta(seconds=60 - step),
                    loss=5.0 / step**0.5,
                    tokens_per_s=900.0 + 7.3 * step + (step % 5) * 40.0,
                )
            )
        for step in range(2, 62, 2):
            db.add(Event(job_id=job_id, team_id=job.team_id, type="CHECKPOINT", message=f"checkpoint at step {step}"))
        db.add(Event(job_id=job_id, team_id=job.team_id, type="SUCCEEDED", message="finished at step 60"))
        job.state, job.last_step, job.last_loss, job.finished_at = "SUCCEEDED", 60, 5.0 / 60**0.5, now
        db.commit()
    return job_id


@pytest.fixture(scope="module")
def mlp_job(kiln: Kiln) -> int:
    """An MLP job (it counts samples) with a single throughput point: 100 samples/s."""
    job_id = int(submit(kiln, spec("one-point", recipe={"name": "mlp", "hyperparameters": {}}))["id"])
    with database(kiln) as db:
        db.add(JobMetric(job_id=job_id, step=1, loss=2.3, tokens_per_s=100.0))
        db.commit()
    return job_id


@pytest.fixture
def page(kiln: Kiln) -> Iterator[Any]:
    with chromium() as browser:
        pg = signed_in_page(browser, kiln.url, kiln.token)
        problems: list[str] = []
        pg.on("pageerror", lambda e: problems.append(f"script error: {e}"))
        pg.on(
            "request",
            lambda r: (
                problems.append(f"external request: {r.url}") if not r.url.startswith((kiln.url, "data:")) else None
            ),
        )
        yield pg
        assert not problems, problems


def test_timeline_shows_the_newest_event_first(page: Any, kiln: Kiln, ended_job: int) -> None:
    from playwright.sync_api import expect

    page.goto(f"{kiln.url}/#/jobs/{ended_job}")
    timeline = page.locator("#timeline")
    expect(timeline.locator("li")).to_have_count(32)  # SUBMITTED, 30 checkpoints, SUCCEEDED
    expect(timeline.locator("li").first).to_have_attribute("data-type", "SUCCEEDED")
    expect(timeline.locator("li").last).to_have_attribute("data-type", "SUBMITTED")
    # Seen without scrolling the timeline's box: both boxes read in one go in the page (the live refresh may
    # redraw the list between two reads from here, and a detached element has no box).
    page.wait_for_function(
        """() => {
            const box = document.querySelector('#timeline'), first = box && box.querySelector('li');
            if (!first) return false;
            const a = box.getBoundingClientRect(), b = first.getBoundingClientRect();
            return b.height > 0 && b.top >= a.top && b.bottom <= a.bottom;
        }""",
        timeout=10_000,
    )


def test_ticks_enclose_the_points_and_units_follow_the_recipe(
    page: Any, kiln: Kiln, ended_job: int, mlp_job: int
) -> None:
    from playwright.sync_api import expect

    page.goto(f"{kiln.url}/#/jobs/{ended_job}")
    throughput = page.locator("figure[data-chart='throughput']")
    expect(throughput).to_have_attribute("data-points", "60")
    expect(throughput.locator("figcaption")).to_have_text("Throughput (tokens/s) over steps")
    for chart in ("loss", "throughput"):
        y = page.locator(f"figure[data-chart='{chart}']").evaluate(Y_AXIS)
        assert y["splits"][0] <= y["lo"] and y["hi"] <= y["splits"][-1], (chart, y)
        assert len(set(y["labels"])) == len(y["labels"]), (chart, y)
        steps = page.locator(f"figure[data-chart='{chart}']").evaluate("(fig) => fig.chart.plot.axes[0]._values")
        assert all(re.fullmatch(r"\d+", s) for s in steps), steps  # whole steps: no tick at step 1.5
    page.locator("figure[data-chart='throughput']").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir() / "dashboard-job-charts.png"))

    page.goto(f"{kiln.url}/#/jobs/{mlp_job}")
    throughput = page.locator("figure[data-chart='throughput']")
    expect(throughput).to_have_attribute("data-points", "1")
    expect(throughput.locator("figcaption")).to_have_text("Throughput (samples/s) over steps")
    y = throughput.evaluate(Y_AXIS)
    assert y["labels"] == ["94", "96", "98", "100", "102", "104", "106"], y  # round, distinct, around the one point


def test_hover_values_and_zoom(page: Any, kiln: Kiln, ended_job: int) -> None:
    from playwright.sync_api import expect

    page.goto(f"{kiln.url}/#/jobs/{ended_job}")
    chart = page.locator("figure[data-chart='loss']")
    expect(chart).to_have_attribute("data-points", "60")
    over = chart.locator(".u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    # Hover: the legend says the step and the loss under the cursor.
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    values = chart.locator(".u-legend .u-value")
    expect(values.first).to_have_text(re.compile(r"^\d+$"))  # the step
    expect(values.nth(1)).to_have_text(re.compile(r"^\d\.\d+$"))  # its loss
    # Drag across the middle: the x axis zooms in to those steps; a double-click zooms out again.
    page.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + box["height"] * 0.5)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5, steps=5)
    page.mouse.up()
    zoomed = chart.evaluate("(fig) => [fig.chart.plot.scales.x.min, fig.chart.plot.scales.x.max]")
    assert 10 < zoomed[0] < zoomed[1] < 40, zoomed
    # A live point (as the job's stream adds them) keeps the zoom; zoomed out, the axis follows the new points.
    scale = "(fig) => [fig.chart.plot.scales.x.min, fig.chart.plot.scales.x.max]"
    add = (
        "(fig, step) => fig.chart.setSeries(fig.chart.series.map((s) => ({...s, points: [...s.points, [step, 0.6]]})))"
    )
    chart.evaluate(add, 61)
    assert chart.evaluate(scale) == zoomed
    over.dblclick()
    assert chart.evaluate(scale) == [1, 61]
    chart.evaluate(add, 62)
    assert chart.evaluate(scale) == [1, 62]


def test_a_sweeps_jobs_each_have_their_own_colour(page: Any, kiln: Kiln) -> None:
    from playwright.sync_api import expect

    rates = [round(0.001 + 0.0005 * i, 4) for i in range(SWEEP_JOBS)]
    sweep = submit(kiln, {**spec("many"), "sweep": {"grid": {"lr": rates}}}, path="/v1/sweeps")
    with database(kiln) as db:
        for i, job in enumerate(db.query(Job).filter(Job.sweep_id == sweep["id"]).all()):
            for step in range(1, 11):
                db.add(JobMetric(job_id=job.id, step=step, loss=3.0 - 0.05 * step - 0.02 * i))
        db.commit()
    page.goto(f"{kiln.url}/#/sweeps/{sweep['id']}")
    chart = page.locator("figure[data-chart='sweep-curves']")
    expect(chart).to_have_attribute("data-series", str(SWEEP_JOBS))
    colours = chart.evaluate("(fig) => fig.chart.plot.series.slice(1).map((s) => s._stroke ?? s.stroke())")
    assert len(colours) == SWEEP_JOBS and len(set(colours)) == SWEEP_JOBS, colours
    over = chart.locator(".u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)  # each job's value in the legend
    expect(chart.locator(".u-legend .u-value").nth(1)).to_have_text(re.compile(r"^\d\.\d+$"))
    page.screenshot(path=str(screenshot_dir() / "dashboard-sweep-colours.png"))
    page.set_viewport_size(
        {"width": 375, "height": 740}
    )  # on a phone the legend wraps: the page never scrolls sideways
    page.wait_for_timeout(300)
    assert page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth") <= 1


def test_sla_page_one_violation_per_job_and_the_window_at_its_buckets(page: Any, kiln: Kiln) -> None:
    from playwright.sync_api import expect

    # Waited 622 s against 600; the evaluator saw the breach at 601 s and said so in its event.
    job_id = int(submit(kiln, spec("late"))["id"])
    now = utcnow()
    with database(kiln) as db:
        job = db.get(Job, job_id)
        assert job is not None
        submitted = now - timedelta(hours=2)
        job.submitted_at, job.admitted_at, job.started_at = submitted, submitted + timedelta(seconds=622), None
        job.state, job.queued_s, job.finished_at = "SUCCEEDED", 622.0, now - timedelta(hours=1)
        db.add(
            Event(
                job_id=job_id,
                team_id=job.team_id,
                type="SLA_QUEUE_WAIT_VIOLATION",
                message="waited 601s in the queue > 600s",
                created_at=submitted + timedelta(seconds=601),
                data={"kind": "queue_wait", "breached_at": (submitted + timedelta(seconds=600)).isoformat()},
            )
        )
        db.commit()

    page.goto(f"{kiln.url}/#/sla")
    rows = page.locator("#sla-violations tbody tr", has=page.locator(f"a[href='#/jobs/{job_id}']"))
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("waited 622s in the queue > 600s")

    # The 7-day window by day: the axis spans the 7 days, and a day with jobs is drawn a day wide.
    chart = page.locator("figure[data-chart='sla-attainment']")
    expect(chart).not_to_have_attribute("data-points", "0")
    span = chart.evaluate("""(fig) => {
      const u = fig.chart.plot, x0 = u.data[0].find((x, i) => u.data[1][i] !== null);
      return { days: (u.scales.x.max - u.scales.x.min) / 86400000,
               dayPx: u.valToPos(x0 + 86400000, "x") - u.valToPos(x0, "x"), width: u.bbox.width / devicePixelRatio };
    }""")
    assert span["days"] >= 7, span
    assert span["dayPx"] >= span["width"] / 8.5, span  # a day is about a seventh of the plot, not a dot
    page.screenshot(path=str(screenshot_dir() / "dashboard-sla-window.png"))
