"""A registered dataset end to end on the embedded default (`kiln up`, the tests' root): a team-admin registers a
directory of .npz shards under the storage root, a job of the team's own code names it, a real worker mounts it
read-only in the attempt's own mount namespace and the user's recipe trains on it to a held-out accuracy; a write
into it from the job fails with EROFS and changes nothing on disk. A dataset that vanished ends its job FAILED
with the reason, without a restart. A `command:` script finds its datasets in KILN_DATASETS, read-only too."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.deps import missing
from tests.e2e.test_kiln_up import JOB_TIMEOUT_S, Up, up_running

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits-npz"

# The example's recipe, plus a write into the dataset when the model is built: the write must fail with EROFS
# (reported as an evaluation metric); if it succeeded the job fails.
PROBE = """
import errno
import npzdigits
from npzdigits import Hyperparameters, batches, loss, items_per_batch

KILN_PROTOCOL = 1
WRITE_ERRNO = [0]


def build_model(hp, *, datasets):
    try:
        with open(datasets["digits-npz"] / "written-by-the-job", "w") as f:
            f.write("x")
    except OSError as exc:
        WRITE_ERRNO[0] = exc.errno
    else:
        raise RuntimeError("the dataset is writable")
    return npzdigits.build_model(hp)


def evaluate(model, hp, *, rank, world_size, datasets):
    metrics = npzdigits.evaluate(model, hp, rank=rank, world_size=world_size, datasets=datasets)
    metrics["write_errno"] = float(WRITE_ERRNO[0])
    return metrics
"""


WRITER = """from npzdigits import KILN_PROTOCOL, Hyperparameters, batches, loss, build_model as _build


def build_model(hp, *, datasets):
    (datasets["digits-npz"] / "train-0.npz").write_bytes(b"overwritten")
    return _build(hp)
"""


def dashboard_shows_the_datasets(up: Up, job_id: str) -> None:
    from playwright.sync_api import expect

    from harness.dashboard import chromium, signed_in_page

    token = json.loads((up.home.parent / "xdg" / "kiln" / "config.json").read_text())["token"]
    with chromium() as browser:
        page = signed_in_page(browser, up.url, token)
        page.goto(f"{up.url}/#/jobs/{job_id}")
        expect(page.locator("#job-datasets")).to_have_text("digits-npz (read-only)")
        expect(page.locator("#job-datasets code")).to_have_attribute("title", "storage: datasets/default/digits-npz")


@pytest.fixture
def kiln_up(tmp_path: Path) -> Iterator[Up]:
    if os.geteuid() != 0:
        missing("read-only mounts need a root worker (the CI runs as root)")
    with up_running(tmp_path) as up:
        yield up


def _make_dataset(up: Up) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_dataset", EXAMPLE / "make_dataset.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    directory = up.home / "storage" / "datasets" / "default" / "digits-npz"
    module.write(directory)
    return directory


def _job_id(out: str) -> str:
    found = re.search(r"submitted job (\d+)", out)
    assert found is not None, out
    return found.group(1)


def test_a_job_trains_on_a_read_only_dataset(kiln_up: Up, tmp_path: Path) -> None:
    up = kiln_up
    said = "sandbox: bubblewrap"

    def started() -> str:
        return "\n".join(p.read_text() for p in (up.home / "logs").glob("*.log")) + up.output()

    deadline = time.monotonic() + 60  # the worker says it once it is up, a moment after `kiln up` has
    while said not in started() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert said in started(), up.logs()
    directory = _make_dataset(up)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}

    typo = up.kiln("datasets", "add", "digits-npz", "datasets/default/../../checkpoints")
    assert typo.returncode == 7 and "contains '..'" in typo.stderr, typo.stderr
    added = up.kiln("datasets", "add", "digits-npz", "datasets/default/digits-npz", "-d", "digits as .npz shards")
    assert added.returncode == 0, added.stderr
    assert "dataset digits-npz registered in team default" in added.stdout
    listed = json.loads(up.kiln("datasets", "ls", "-o", "json").stdout)
    assert [(d["name"], d["available"]) for d in listed] == [("digits-npz", True)]

    work = tmp_path / "work"
    shutil.copytree(EXAMPLE, work)
    (work / "probe.py").write_text(PROBE)
    job = (EXAMPLE / "job.yaml").read_text().replace("entry_point: npzdigits", "entry_point: probe")
    (tmp_path / "job.yaml").write_text(job)

    (tmp_path / "typo.yaml").write_text(job.replace("datasets: [digits-npz]", "datasets: [digits-np]"))
    wrong = up.kiln("submit", str(tmp_path / "typo.yaml"), "--workdir", str(work))
    assert wrong.returncode == 7, wrong.stdout + wrong.stderr
    assert "datasets.0" in wrong.stderr and "did you mean 'digits-npz'?" in wrong.stderr, wrong.stderr

    followed = up.kiln("submit", str(tmp_path / "job.yaml"), "--workdir", str(work), "--follow", timeout=JOB_TIMEOUT_S)
    assert followed.returncode == 0, f"{followed.stdout}\n{followed.stderr}\n{up.logs()}"
    job_id = _job_id(followed.stdout)
    shown = json.loads(up.kiln("describe", job_id, "-o", "json").stdout)
    metrics = shown["code"]["evaluation"]["metrics"]
    assert metrics["write_errno"] == errno.EROFS, metrics  # the write was refused as read-only
    assert metrics["accuracy"] >= 0.9, metrics  # it trained on the dataset's shards
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before  # nothing changed on disk
    described = up.kiln("describe", job_id).stdout
    assert "digits-npz (read-only)" in described, described
    log = next((up.home / "storage" / "logs" / job_id).glob("*.log")).read_text()
    assert "datasets digits-npz bound read-only under /datasets" in log, log
    assert "inside its bubblewrap sandbox" in log, log

    dashboard_shows_the_datasets(up, job_id)

    # A write the recipe does not catch: the user's error (its own line), FAILED at once, not a host's I/O error.
    (work / "writer.py").write_text(WRITER)
    (tmp_path / "writer.yaml").write_text(job.replace("entry_point: probe", "entry_point: writer"))
    wrote = up.kiln("submit", str(tmp_path / "writer.yaml"), "--workdir", str(work), "--follow", timeout=JOB_TIMEOUT_S)
    writer = json.loads(up.kiln("describe", _job_id(wrote.stdout), "-o", "json").stdout)["job"]
    assert writer["state"] == "FAILED" and writer["restart_count"] == 0, writer
    assert "your build_model(): OSError: [Errno 30] Read-only file system" in writer["exit_reason"], writer
    assert "(writer.py:5)" in writer["exit_reason"], writer
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before

    busy_rm = up.kiln("datasets", "rm", "digits-npz")
    assert busy_rm.returncode == 0, busy_rm.stderr  # the job ended: nothing names it any more
    assert "its files were not touched" in busy_rm.stdout and directory.is_dir()


def test_a_dataset_that_vanished_fails_the_job_without_restarts(kiln_up: Up, tmp_path: Path) -> None:
    up = kiln_up
    directory = _make_dataset(up)
    assert up.kiln("datasets", "add", "digits-npz", "datasets/default/digits-npz").returncode == 0
    held = directory.with_name("digits-npz.away")
    os.rename(directory, held)  # gone between the submit and the attempt
    submitted = up.kiln("submit", str(EXAMPLE / "job.yaml"), "--workdir", str(EXAMPLE))
    assert submitted.returncode == 0, submitted.stderr
    job_id = _job_id(submitted.stdout)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:
        job = json.loads(up.kiln("describe", job_id, "-o", "json").stdout)["job"]
        if job["state"] in ("FAILED", "SUCCEEDED", "CANCELLED"):
            break
        assert time.monotonic() < deadline, job
        time.sleep(1)
    assert job["state"] == "FAILED" and job["restart_count"] == 0, job
    assert "dataset 'digits-npz'" in job["exit_reason"] and "does not exist" in job["exit_reason"], job


SCRIPT = """import errno, json, os, pathlib, sys
import numpy as np

paths = json.loads(os.environ["KILN_DATASETS"])
root = pathlib.Path(paths["digits-npz"])
images = sum(len(np.load(p)["y"]) for p in sorted(root.glob("train-*.npz")))
try:
    (root / "written-by-the-script").write_text("x")
except OSError as exc:
    print(f"script: read {images} training images; the write failed with {errno.errorcode[exc.errno]}", flush=True)
    sys.exit(0)
sys.exit("script: the dataset is writable")
"""


def test_a_script_reads_its_datasets_from_the_environment_read_only(kiln_up: Up, tmp_path: Path) -> None:
    up = kiln_up
    directory = _make_dataset(up)
    assert up.kiln("datasets", "add", "digits-npz", "datasets/default/digits-npz").returncode == 0
    work = tmp_path / "script"
    work.mkdir()
    (work / "read.py").write_text(SCRIPT)
    (tmp_path / "job.yaml").write_text(
        "name: reads\nteam: default\ncommand: [python, read.py]\ndatasets: [digits-npz]\nsteps: 1\n"
        "resources: {gpus: 0, cpu_slots: 1}\n"
    )
    done = up.kiln("submit", str(tmp_path / "job.yaml"), "--workdir", str(work), "--follow", timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{up.logs()}"
    log = next((up.home / "storage" / "logs" / _job_id(done.stdout)).glob("*.log")).read_text()
    assert "script: read 1437 training images; the write failed with EROFS" in log, log
    assert not (directory / "written-by-the-script").exists()
