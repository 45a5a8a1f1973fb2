"""The submit page's estimate in a real browser (Debian's Chromium through Playwright) against the real API: with a
measured run of the shape in the database, the estimate follows the form and the YAML editor as the user types,
and says why there is none while the spec is invalid.

    .venv/bin/pytest tests/e2e/test_dashboard_estimate.py -v
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy.orm import Session

from harness.dashboard import Kiln, chromium, running_kiln, screenshot_dir, signed_in_page
from tests.support.measured_runs import record_run

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STEP_S, STARTUP_S = 0.05, 4.0


@pytest.fixture(scope="module")
def kiln(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kiln]:
    with running_kiln(tmp_path_factory.mktemp("kiln-estimate")) as k:
        yield k


def measured_run(kiln: Kiln) -> None:
    """The shipped example, submitted (to the team bootstrap made), with what a worker would have recorded of one
    run: 60 steps of ``STEP_S`` after ``STARTUP_S`` (no worker runs here: the figures are known)."""
    from core.db import make_engine

    with kiln.api() as api:
        r = api.post("/v1/jobs", json=yaml.safe_load((ROOT / "examples" / "gpt-tiny.yaml").read_text()))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    engine = make_engine(kiln.env["KILN_DATABASE_URL"])
    with Session(engine) as db:
        record_run(db, job_id, startup_s=STARTUP_S, step_s=[STEP_S] * 60, gpu_type="cpu")
        db.commit()
    engine.dispose()


def test_the_estimate_follows_the_spec_as_it_is_typed(kiln: Kiln) -> None:
    from playwright.sync_api import expect

    measured_run(kiln)
    with chromium() as browser:
        page = signed_in_page(browser, kiln.url, kiln.token)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.get_by_role("link", name="Submit", exact=True).click()
        summary, first_row = page.locator("#estimate-summary"), page.locator("#estimate-options tbody tr").first
        # The form's defaults are the shipped example's shape: measured, and the job as written is the cheapest.
        expect(summary).to_have_text(
            "cheapest: 1 CPU slot, eager, fp32: 0.00194 slot-h, 9.72e-05 USD (the job as written)"
        )
        expect(first_row).to_contain_text("as written · recommended")
        expect(first_row).to_contain_text("50.0 ms (50.0 ms–50.0 ms), measured")
        expect(first_row).to_contain_text("7.0s")  # 4 s to the first step + 60 x 0.05 s

        page.get_by_label("Steps", exact=True).fill("600")  # as the user types: 4 + 600 x 0.05 s
        expect(first_row).to_contain_text("34s")
        page.get_by_label("Steps", exact=True).fill("0")
        expect(summary).to_contain_text("No estimate until the spec is valid: steps:")
        page.get_by_label("Steps", exact=True).fill("60")
        expect(first_row).to_contain_text("7.0s")
        page.screenshot(path=str(screenshot_dir() / "dashboard-estimate.png"), full_page=True)

        # The YAML editor: the estimate follows what is shown.
        page.get_by_role("button", name="YAML editor").click()
        box = page.get_by_label("Job spec (YAML)")
        box.fill(box.input_value().replace("steps: 60", "steps: 1000"))
        expect(first_row).to_contain_text("54s")
        box.fill(box.input_value().replace("  cpu_slots: 1", "  cpu_slots: 1\n  gpu_typ: H200"))
        expect(summary).to_contain_text("resources.gpu_typ: unknown field 'gpu_typ'; did you mean 'gpu_type'?")
        assert not errors, errors
