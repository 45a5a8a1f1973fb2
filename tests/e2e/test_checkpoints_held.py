"""The checkpoints a job lists are those it holds (issue 42, point 4): its trainer keeps the newest
``checkpointing.keep_last`` on disk and deletes the others, and ``GET /v1/jobs/{id}/checkpoints``, ``kiln describe``
and the dashboard's job page listed every checkpoint ever written, each "verified yes" (14 rows for a job with 2
files). The shipped example, checkpointing every 10 steps over 60 with ``keep_last: 2``, on a real ``kiln up``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.dashboard import chromium
from tests.e2e.test_kiln_up import ROOT, Up, _finished

pytestmark = pytest.mark.e2e


def test_describe_api_and_dashboard_list_only_the_checkpoints_kept(kiln_up: Up, tmp_path: Path) -> None:
    spec = tmp_path / "often.yaml"
    spec.write_text((ROOT / "examples" / "gpt-tiny.yaml").read_text().replace("every_steps: 20", "every_steps: 10"))
    submitted = kiln_up.kiln("submit", str(spec), "-o", "json")
    assert submitted.returncode == 0, submitted.stderr
    job_id = str(json.loads(submitted.stdout)["id"])
    assert _finished(kiln_up, job_id)["state"] == "SUCCEEDED", kiln_up.logs()

    shown = json.loads(kiln_up.kiln("describe", job_id, "-o", "json").stdout)
    rows = shown["checkpoints"]
    assert [r["step"] for r in rows] == [50, 60], rows  # six written, the newest two kept
    assert all(r["verified"] and Path(r["path"]).is_dir() for r in rows), rows
    on_disk = sorted(p.name for p in Path(rows[0]["path"]).parent.iterdir() if p.name.startswith("step_"))
    assert on_disk == ["step_00000050", "step_00000060"], on_disk
    table = kiln_up.kiln("describe", job_id).stdout.split("Checkpoints")[1].split("\n\n")[0]
    assert [line.split()[0] for line in table.splitlines()[2:] if line.strip()] == ["50", "60"], table
    events = json.loads(kiln_up.kiln("events", job_id, "-o", "json").stdout)
    assert sum(e["type"] == "CHECKPOINT" for e in events) == 6  # the timeline still tells of every save

    token = json.loads((tmp_path / "xdg" / "kiln" / "config.json").read_text())["token"]
    with chromium() as browser:
        from playwright.sync_api import expect

        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{kiln_up.url}/")
        page.get_by_label("API token").fill(token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector("#queue-list table")
        page.goto(f"{kiln_up.url}/#/jobs/{job_id}")
        listed = page.locator("#checkpoints tbody tr")
        expect(listed).to_have_count(2)
        expect(listed.first).to_be_visible()
        # Each row's step cell by itself: a row's innerText has no separators between cells while the page is not
        # laid out yet ("505.5" for 50 and 5.5 MB, once in CI), and textContent never has.
        steps = page.locator("#checkpoints tbody tr td:first-child").all_text_contents()
        assert [s.strip() for s in steps] == ["50", "60"]
