"""The dashboard's sweep view in a real browser (Debian's Chromium through Playwright) against the real system: a
sweep of three tiny jobs runs through the scheduler and a worker to the end, then its summary table shows their
final losses best first by the sweep's objective, and sorts by any column, both ways.

    .venv/bin/pytest tests/e2e/test_dashboard_sweeps.py -v
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.dashboard import Kiln, chromium, running_kiln, screenshot_dir

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LRS = [0.001, 0.03, 0.01]


@pytest.fixture(scope="module")
def kiln(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kiln]:
    with running_kiln(tmp_path_factory.mktemp("kiln-sweeps")) as k:
        yield k


def submit_sweep(kiln: Kiln, api: Any, name: str, *, steps: int, max_concurrent: int) -> int:
    """The shipped example over ``LRS``, with the scheduler and a worker running; returns the sweep's id."""
    doc = yaml.safe_load((ROOT / "examples" / "gpt-tiny.yaml").read_text())
    doc.update(name=name, steps=steps, sweep={"grid": {"lr": LRS}, "max_concurrent": max_concurrent})
    doc["checkpointing"] = {"every_steps": 3, "keep_last": 1}
    r = api.post("/v1/sweeps", json=doc)
    assert r.status_code == 201, r.text
    kiln.start_scheduler()
    kiln.start_worker(cpu_slots=2)
    return int(r.json()["id"])


def run_sweep(kiln: Kiln) -> dict[str, Any]:
    with kiln.api() as api:
        sweep_id = submit_sweep(kiln, api, "lr-sweep", steps=6, max_concurrent=2)
        deadline = time.monotonic() + 900  # three real trainings on a shared CPU: a generous bound, not a measure
        while True:
            sweep = api.get(f"/v1/sweeps/{sweep_id}").json()
            states = [j["state"] for j in sweep["jobs"]]
            if all(s in ("SUCCEEDED", "FAILED", "CANCELLED") for s in states):
                break
            assert time.monotonic() < deadline, (states, kiln.log("worker"), kiln.log("scheduler"))
            time.sleep(1)
    assert states == ["SUCCEEDED"] * 3, (sweep, kiln.log("worker"))
    return sweep


def signed_in(browser: Any, kiln: Kiln) -> tuple[Any, list[str]]:
    """A page of the dashboard signed in with the admin's token, and the script errors and 4xx/5xx it meets."""
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(f"{kiln.url}/")
    page.get_by_label("API token").fill(kiln.token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#queue-list table")
    return page, problems


def rows(page: Any) -> list[list[str]]:
    body = page.locator("#sweep-summary tbody tr")
    return [[c.strip() for c in r.locator("td").all_inner_texts()] for r in body.all()]


def test_sweep_summary_best_first_and_sortable(kiln: Kiln) -> None:
    from playwright.sync_api import expect

    sweep = run_sweep(kiln)
    by_loss = sorted(sweep["jobs"], key=lambda j: j["last_loss"])
    assert len({j["last_loss"] for j in by_loss}) == 3, by_loss  # distinct losses: the order means something
    with chromium() as browser:
        page, problems = signed_in(browser, kiln)
        page.get_by_role("link", name="Sweeps", exact=True).click()
        link = page.get_by_role("link", name=str(sweep["id"]), exact=True)
        best = page.locator("#sweeps tbody tr").filter(has=link).locator("td").nth(5)  # its objective, its best job's
        expect(best).to_have_text(f"loss {by_loss[0]['last_loss']:.4f}")
        page.get_by_role("link", name=str(sweep["id"]), exact=True).click()
        expect(page.locator("#sweep-objective")).to_contain_text("Best first by loss (minimize)")
        # Each job's curve of the objective (here its training loss) over its steps, in one chart.
        curves = page.locator("figure[data-chart='sweep-curves']")
        expect(curves.locator("figcaption")).to_have_text("loss over steps, each job (best first)")
        expect(curves).to_have_attribute("data-series", "3")
        expect(curves.locator(".u-legend .u-series")).to_have_count(4)  # the step, then each job
        table = page.locator("#sweep-summary table")
        expect(table.locator("thead th")).to_have_text(["Rank ▲", "Job", "State", "lr", "Step", "Final loss"])

        # Best first: the sweep's objective (the lowest final loss) on top, without a click.
        expect(table.locator("th[data-key='rank']")).to_have_attribute("aria-sort", "ascending")
        shown = rows(page)
        assert [r[1].split()[0] for r in shown] == [str(j["id"]) for j in by_loss], shown
        assert [r[0] for r in shown] == ["1", "2", "3"] and all(r[2] == "SUCCEEDED" for r in shown)
        assert [r[4] for r in shown] == ["6 / 6"] * 3

        # Sort by lr, then reverse it; then by loss descending (worst first).
        table.get_by_role("button", name="lr").click()
        expect(table.locator("th[data-key='setting:lr']")).to_have_attribute("aria-sort", "ascending")
        expect(table.locator("th[data-key='rank']")).to_have_attribute("aria-sort", "none")
        assert [float(r[3]) for r in rows(page)] == sorted(LRS)
        table.get_by_role("button", name="lr").click()
        expect(table.locator("th[data-key='setting:lr']")).to_have_attribute("aria-sort", "descending")
        assert [float(r[3]) for r in rows(page)] == sorted(LRS, reverse=True)
        table.get_by_role("button", name="Final loss").click()
        table.get_by_role("button", name="Final loss").click()
        expect(table.locator("th[data-key='loss']")).to_have_attribute("aria-sort", "descending")
        assert [r[1].split()[0] for r in rows(page)] == [str(j["id"]) for j in reversed(by_loss)]

        # The chosen order outlives the page's refresh (every 5 s), and a job's link opens it.
        with page.expect_response(lambda r: r.url.endswith(f"/v1/sweeps/{sweep['id']}")):
            pass  # the next refresh
        expect(table.locator("th[data-key='loss']")).to_have_attribute("aria-sort", "descending")
        page.screenshot(path=str(screenshot_dir() / "dashboard-sweep.png"), full_page=True)
        page.get_by_role("link", name=f"{by_loss[0]['id']} {by_loss[0]['name']}").click()
        expect(page.locator("#job-state")).to_have_attribute("data-state", "SUCCEEDED")
    assert not problems, problems


def test_a_sweeps_queued_jobs_are_held_and_released_from_its_page(kiln: Kiln) -> None:
    from playwright.sync_api import expect

    with kiln.api() as api:
        sweep_id = submit_sweep(kiln, api, "held-sweep", steps=100_000, max_concurrent=1)

        def held() -> list[int]:
            return [j["id"] for j in api.get("/v1/jobs", params={"sweep": sweep_id, "held": "true"}).json()["items"]]

        deadline = time.monotonic() + 120  # one runs, the sweep's limit keeps the two others queued
        while sorted(j["state"] for j in api.get(f"/v1/sweeps/{sweep_id}").json()["jobs"]) != [
            "QUEUED",
            "QUEUED",
            "RUNNING",
        ]:
            assert time.monotonic() < deadline, (kiln.log("worker"), kiln.log("scheduler"))
            time.sleep(0.5)
        try:
            with chromium() as browser:
                page, problems = signed_in(browser, kiln)
                page.goto(f"{kiln.url}/#/sweeps/{sweep_id}")
                page.get_by_role("button", name="Hold queued").click()
                expect(page.locator("#toast")).to_contain_text(f"Held 2 jobs of sweep {sweep_id}")
                expect(page.locator("#sweep-summary tbody")).to_contain_text("QUEUED held")
                assert len(held()) == 2
                page.get_by_role("button", name="Hold queued").click()  # nothing left to hold
                expect(page.locator("#toast")).to_contain_text("No queued job of this sweep to hold.")
                page.get_by_role("button", name="Release held").click()
                expect(page.locator("#toast")).to_contain_text(f"Released 2 jobs of sweep {sweep_id}")
                expect(page.locator("#sweep-summary tbody")).not_to_contain_text("QUEUED held")
                assert held() == []
                page.once("dialog", lambda dialog: dialog.accept())  # "Cancel the 3 jobs of sweep N ...?"
                page.get_by_role("button", name="Cancel sweep").click()
                expect(page.locator("#toast")).to_contain_text(f"Cancelled 3 jobs of sweep {sweep_id}")
                cancelled = api.get(f"/v1/sweeps/{sweep_id}").json()["jobs"]
                queued = [j for j in cancelled if j["state"] != "RUNNING"]  # the running one stops, checkpoint first
                assert len(queued) >= 2 and all(j["state"] == "CANCELLED" for j in queued), cancelled
                assert not problems, problems
        finally:
            for j in api.get(f"/v1/sweeps/{sweep_id}").json()["jobs"]:
                api.post(f"/v1/jobs/{j['id']}/cancel")


def test_a_sweep_is_submitted_from_the_yaml_editor(kiln: Kiln) -> None:
    """A spec with a sweep section in the Submit page's YAML editor is a sweep: a malformed range is shown at its
    line, and once fixed the sweep's page opens with its first jobs and says how it stops jobs early and how it
    searches (adaptively: its first two random draws now, the third proposed later)."""
    from playwright.sync_api import expect

    with chromium() as browser:
        page, problems = signed_in(browser, kiln)
        page.get_by_role("link", name="Submit", exact=True).click()
        page.get_by_role("button", name="YAML editor").click()
        box = page.get_by_label("Job spec (YAML)")
        spec = box.input_value().replace("name: gpt-tiny", "name: yaml-sweep")
        section = (
            "sweep:\n  random:\n    lr: {log_uniform: [0.01, 0.001]}\n  count: 3\n  max_concurrent: 1\n"
            "  search: tpe\n  initial: 2\n"
            "  objective: {metric: accuracy, goal: maximize}\n"
            "  early_stopping: {rule: successive_halving, min_steps: 4}\n"
        )
        box.fill(spec.rstrip("\n") + "\n" + section)
        page.get_by_role("button", name="Submit YAML").click()
        error = page.locator("#yaml-errors li[data-loc='sweep.random.lr.log_uniform']")
        lr_line = (spec.rstrip("\n") + "\n" + section).splitlines().index("    lr: {log_uniform: [0.01, 0.001]}") + 1
        expect(error).to_contain_text(f"line {lr_line}")
        expect(error).to_contain_text("the low end 0.01 is above the high end 0.001")
        box.fill(box.input_value().replace("[0.01, 0.001]", "[0.001, 0.01]"))
        page.get_by_role("button", name="Submit YAML").click()
        expect(page).to_have_url(re.compile(r"#/sweeps/\d+$"))
        sweep_id = int(page.url.rsplit("/", 1)[1])
        expect(page.locator("#sweep-summary tbody tr")).to_have_count(2)
        expect(page.locator("#sweep-objective")).to_contain_text(
            "Stops early by successive halving: at 4, 12, 36, ... steps a job goes on only while among the best 1/3"
        )
        expect(page.locator("#sweep-objective")).to_contain_text(
            "Searches by TPE (tree-structured Parzen estimators): 2 random draws, then each next job's settings "
            "proposed from the jobs that ended, 1 at a time, 3 jobs in all."
        )
        assert problems == [f"422 {kiln.url}/v1/sweeps"], problems  # the malformed range, and nothing else
    with kiln.api() as api:
        assert api.post(f"/v1/sweeps/{sweep_id}/cancel").json()["search_closed"] == "cancelled by admin"


def test_a_finished_sweep_offers_no_hold_release_or_cancel(kiln: Kiln) -> None:
    """Issue 42, point 7: once every job of a sweep has ended, its page no longer offers to hold, release or cancel
    it (they did nothing but say so); it says the sweep is over. The buttons go at the page's own refresh."""
    from playwright.sync_api import expect

    doc = yaml.safe_load((ROOT / "examples" / "gpt-tiny.yaml").read_text())
    doc.update(name="over-sweep", sweep={"grid": {"lr": LRS[:2]}})
    with kiln.api() as api:
        r = api.post("/v1/sweeps", json=doc, params={"hold": "true"})  # held: nothing starts, whatever runs
        assert r.status_code == 201, r.text
        sweep_id = r.json()["id"]
        with chromium() as browser:
            page, problems = signed_in(browser, kiln)
            page.goto(f"{kiln.url}/#/sweeps/{sweep_id}")
            buttons = [page.get_by_role("button", name=n) for n in ("Hold queued", "Release held", "Cancel sweep")]
            for button in buttons:  # a live sweep: all three
                expect(button).to_be_visible()
            cancelled = api.post(f"/v1/sweeps/{sweep_id}/cancel").json()
            assert [j["state"] for j in cancelled["jobs"]] == ["CANCELLED", "CANCELLED"], cancelled
            for button in buttons:
                expect(button).to_be_hidden(timeout=15_000)
            expect(page.locator("#sweep-objective")).to_contain_text("Over: every job has ended.")
            page.reload()  # opened once it is over: never shown
            expect(page.locator("#sweep-summary tbody tr")).to_have_count(2)
            for button in buttons:
                expect(button).to_be_hidden()
            assert not problems, problems
