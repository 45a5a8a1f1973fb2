"""A team's own code end to end on the embedded default (issue: bring your own training code): `kiln submit
--workdir` packs and uploads examples/digits once, the worker fetches and verifies it, kiln's trainer runs the
user's CNN to a held-out accuracy >= 0.95 and the CLI prints it; a second submit of the same code sends 0 bytes."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_kiln_up import JOB_TIMEOUT_S, Up

pytestmark = pytest.mark.e2e

DIGITS = "examples/digits"


def test_digits_trains_from_uploaded_code_and_a_second_submit_sends_nothing(kiln_up: Up, tmp_path: Path) -> None:
    up = kiln_up
    followed = up.kiln("submit", f"{DIGITS}/job.yaml", "--workdir", DIGITS, "--follow", timeout=JOB_TIMEOUT_S)
    assert followed.returncode == 0, f"{followed.stdout}\n{followed.stderr}\n{up.logs()}"
    uploaded = re.search(r"code ([0-9a-f]{12}) .*: uploaded (\d+) bytes", followed.stderr)
    assert uploaded is not None and int(uploaded.group(2)) > 0, followed.stderr
    accuracies = [float(a) for a in re.findall(r"accuracy (\d\.\d+)", followed.stdout + followed.stderr)]
    assert accuracies and accuracies[-1] >= 0.95, followed.stdout
    job_id = re.search(r"submitted job (\d+)", followed.stdout).group(1)  # type: ignore[union-attr]

    shown = json.loads(up.kiln("describe", job_id, "-o", "json").stdout)
    digest = shown["job"]["spec"]["code"]["digest"]
    assert digest.startswith(uploaded.group(1))
    assert shown["code"]["evaluation"]["metrics"]["accuracy"] == pytest.approx(accuracies[-1], abs=1e-4)
    described = up.kiln("describe", job_id).stdout
    for fragment in (f"sha256:{digest}", "digits", f"/v1/teams/default/artifacts/{digest}/archive", "accuracy"):
        assert fragment in described, described

    token = json.loads((tmp_path / "xdg" / "kiln" / "config.json").read_text())["token"]
    archive = httpx.get(
        f"{up.url}/v1/teams/default/artifacts/{digest}/archive",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert archive.status_code == 200 and hashlib.sha256(archive.content).hexdigest() == digest

    dashboard_shows_code_and_evaluation(up.url, token, job_id, digest, tmp_path)

    again = up.kiln("submit", f"{DIGITS}/job.yaml", "--workdir", DIGITS)
    assert again.returncode == 0, again.stderr
    assert f"code {digest[:12]}" in again.stderr and "already uploaded, 0 bytes sent" in again.stderr
    second = re.search(r"submitted job (\d+)", again.stdout).group(1)  # type: ignore[union-attr]
    assert json.loads(up.kiln("describe", second, "-o", "json").stdout)["job"]["spec"]["code"]["digest"] == digest
    assert up.kiln("cancel", second).returncode == 0


def dashboard_shows_code_and_evaluation(url: str, token: str, job_id: str, digest: str, tmp: Path) -> None:
    """The job page: the code's digest and entry point, its archive downloadable, the evaluation plotted."""
    from playwright.sync_api import expect

    from harness.dashboard import chromium

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900}, accept_downloads=True)  # type: ignore[attr-defined]
        page.goto(f"{url}/")
        page.get_by_label("API token").fill(token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector("#queue-list table")
        page.goto(f"{url}/#/jobs/{job_id}")
        expect(page.locator("#code-digest")).to_have_text(f"sha256:{digest}")
        expect(page.locator("#job-facts")).to_contain_text("accuracy")
        expect(page.locator("[data-chart=evaluation]")).to_be_visible()
        with page.expect_download() as info:
            page.locator("#code-download").click()
        saved = tmp / "downloaded.tar.gz"
        info.value.save_as(saved)
        assert hashlib.sha256(saved.read_bytes()).hexdigest() == digest
        page.screenshot(path=str(tmp / "job-user-code.png"), full_page=True)


BROKEN = """
KILN_PROTOCOL = 1
import torch
from pydantic import BaseModel


class Hyperparameters(BaseModel):
    width: int = 8


def build_model(hp):
    return torch.nn.Linear(hp.width, 10)


def batches(hp, *, rank, world_size, seed, start):
    while True:
        yield torch.randn(4, hp.width + 1), torch.zeros(4, dtype=torch.long)  # one column too many


def loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)
"""
JOB = """
name: broken
team: default
code: {entry_point: mymodel}
recipe: {name: mine, hyperparameters: {width: 8}}
steps: 20
resources: {gpus: 0, cpu_slots: 1}
compile: {mode: "off"}
precision: fp32
"""


def test_a_mistake_in_the_code_fails_once_with_the_users_own_line(kiln_up: Up, tmp_path: Path) -> None:
    up = kiln_up
    work = tmp_path / "work"
    work.mkdir()
    (work / "mymodel.py").write_text(BROKEN)
    (tmp_path / "job.yaml").write_text(JOB)
    line_no = BROKEN.splitlines().index("    return torch.nn.functional.cross_entropy(model(x), y)") + 1

    checked = up.kiln("submit", str(tmp_path / "job.yaml"), "--workdir", str(work), "--check", timeout=120)
    assert checked.returncode == 7, checked.stdout + checked.stderr
    assert "check failed: your loss(): RuntimeError: mat1 and mat2 shapes cannot be multiplied" in checked.stderr
    assert f"(mymodel.py:{line_no})" in checked.stderr
    assert json.loads(up.kiln("ls", "-o", "json").stdout) == []  # nothing submitted ...
    token = json.loads((tmp_path / "xdg" / "kiln" / "config.json").read_text())["token"]
    stored = httpx.get(f"{up.url}/v1/teams/default/artifacts", headers={"Authorization": f"Bearer {token}"})
    assert stored.json()["items"] == []  # ... and nothing uploaded

    followed = up.kiln("submit", str(tmp_path / "job.yaml"), "--workdir", str(work), "--follow", timeout=300)
    assert followed.returncode == 1, followed.stdout + followed.stderr
    job_id = re.search(r"submitted job (\d+)", followed.stdout).group(1)  # type: ignore[union-attr]
    job = json.loads(up.kiln("describe", job_id, "-o", "json").stdout)["job"]
    assert job["state"] == "FAILED" and job["restart_count"] == 0
    assert "RuntimeError" in job["exit_reason"] and f"(mymodel.py:{line_no})" in job["exit_reason"], job
    listed = up.kiln("ls").stdout
    assert "FAILED" in listed and "mymodel.py" in listed, listed


TYPO = JOB.replace("name: broken", "name: typo").replace("{width: 8}", "{widht: 8}")
TYPO_REASON = (
    "reading the hyperparameters: ValueError: recipe.hyperparameters.widht: unknown hyperparameter; "
    "did you mean 'width'?"
)


def test_a_misspelt_hyperparameter_is_refused_at_submit_or_fails_at_once_saying_so(kiln_up: Up, tmp_path: Path) -> None:
    """Issue 42, point 3. The CLI has torch here, so `kiln submit --workdir` reads the code's own hyperparameters by
    default (it accepted the typo unless --check was given) and refuses the job with the trainer's line. Past that
    (--no-check, or a client without torch) the job fails in its first seconds, with that same line in kiln ls,
    describe, why and the dashboard's queue and job pages."""
    up = kiln_up
    work = tmp_path / "work"
    work.mkdir()
    (work / "mymodel.py").write_text(BROKEN.replace("hp.width + 1", "hp.width"))  # nothing else wrong with it
    (tmp_path / "typo.yaml").write_text(TYPO)

    refused = up.kiln("submit", str(tmp_path / "typo.yaml"), "--workdir", str(work), timeout=120)
    assert refused.returncode == 7, refused.stdout + refused.stderr
    assert f"check failed: {TYPO_REASON}" in refused.stderr
    assert json.loads(up.kiln("ls", "-o", "json").stdout) == []  # nothing submitted

    sent = up.kiln("submit", str(tmp_path / "typo.yaml"), "--workdir", str(work), "--no-check", "--follow", timeout=300)
    assert sent.returncode == 1, sent.stdout + sent.stderr
    job_id = re.search(r"submitted job (\d+)", sent.stdout).group(1)  # type: ignore[union-attr]
    shown = json.loads(up.kiln("describe", job_id, "-o", "json").stdout)
    reason = f"user error: {TYPO_REASON}"
    assert (shown["job"]["state"], shown["job"]["exit_reason"]) == ("FAILED", reason), shown["job"]
    (attempt,) = shown["attempts"]
    ran = datetime.fromisoformat(attempt["ended_at"]) - datetime.fromisoformat(attempt["started_at"])
    assert ran.total_seconds() < 60, attempt  # 8 s on this box: before the model or the data is built
    assert reason in up.kiln("ls").stdout and reason in up.kiln("describe", job_id).stdout
    assert up.kiln("why", job_id).stdout.strip() == f"job {job_id} is FAILED: {reason}"

    from playwright.sync_api import expect

    from harness.dashboard import chromium

    token = json.loads((tmp_path / "xdg" / "kiln" / "config.json").read_text())["token"]
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
        page.goto(f"{up.url}/")
        page.get_by_label("API token").fill(token)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("button", name="Finished").click()
        expect(page.locator("#queue-list tbody tr").filter(has_text=f"#{job_id}")).to_contain_text(reason)
        page.goto(f"{up.url}/#/jobs/{job_id}")
        expect(page.locator("#job-facts")).to_contain_text(reason)
