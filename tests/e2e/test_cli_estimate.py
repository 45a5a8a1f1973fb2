"""``kiln estimate`` against the real API (a uvicorn subprocess on SQLite, as ``test_cli_api``): the table, the JSON,
what it says with no history and with a measured run, and its exit codes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from cli.errors import ExitCode
from core.db import make_engine
from tests.e2e import test_cli_api
from tests.e2e.test_cli_api import EXAMPLE, Server, spec_file, submit
from tests.support.measured_runs import record_run

pytestmark = pytest.mark.e2e

server, kiln = test_cli_api.server, test_cli_api.kiln  # its fixtures: a server of this module's own

DIGITS = EXAMPLE.parent / "digits" / "job.yaml"


def _finished(server: Server, job_id: int, step_s: float, startup_s: float) -> None:
    """What the worker would have recorded for a run of the job: 60 steps of ``step_s`` after ``startup_s``."""
    engine = make_engine(f"sqlite:///{server.home / 'kiln.db'}")
    with Session(engine) as db:
        record_run(db, job_id, startup_s=startup_s, step_s=[step_s] * 60, gpu_type="cpu")
        db.commit()
    engine.dispose()


def test_estimate_without_history_says_so_and_nothing_is_submitted(kiln: Any) -> None:
    before = json.loads(kiln("ls", "-o", "json").stdout)
    shown = kiln("estimate", str(DIGITS))
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("digits: digits-cnn (digits: batch_size=64 channels=16 hidden=64), 200 steps")
    assert lines[1].split()[:3] == ["OPTION", "CHANGES", "MEMORY/GPU"]
    assert lines[2].split()[:6] == ["=", "1", "CPU", "slot,", "eager,", "fp32"]
    assert "no history" in lines[2]
    assert "no measured history of this recipe yet" in shown.stdout
    assert json.loads(kiln("ls", "-o", "json").stdout) == before


def test_estimate_reads_a_measured_run_and_answers_json(kiln: Any, server: Server, tmp_path: Path) -> None:
    # a recipe shape of its own, so that no other test's job is history here
    path = spec_file(tmp_path, **{"batch_size: 8": "batch_size: 6"})
    job_id = submit(kiln, path)
    _finished(server, job_id, step_s=0.05, startup_s=4.0)
    answer = json.loads(kiln("estimate", str(path), "-o", "json").stdout)
    written = answer["options"][0]
    assert written["step_time"]["basis"] == "measured" and written["step_time"]["median_s"] == 0.05
    assert written["gpu_hours"] == (4.0 + 60 * 0.05) / 3600
    assert answer["recommended"] == 0 and answer["summary"].endswith("(the job as written)")
    table = kiln("estimate", str(path), "--all")
    assert table.exit_code == 0
    row = next(line for line in table.stdout.splitlines() if line.startswith("=*"))
    assert "50ms (50ms-50ms)" in row and "measured" in row and "7s" in row


def test_estimate_exit_codes(kiln: Any, tmp_path: Path) -> None:
    assert kiln("estimate", str(tmp_path / "missing.yaml")).exit_code == ExitCode.USAGE
    bad = kiln("estimate", str(spec_file(tmp_path, **{"steps: 60": "steps: 0"})))
    assert bad.exit_code == ExitCode.INVALID and "steps" in bad.stderr
    other = kiln("estimate", str(spec_file(tmp_path, **{"team: default": "team: nobody"})))
    assert other.exit_code == ExitCode.NOT_FOUND and "team 'nobody' not found" in other.stderr


def test_estimate_with_a_deadline_says_in_one_sentence_where_the_queue_leaves_it(
    kiln: Any, server: Server, tmp_path: Path
) -> None:
    """The table's sentence is the API's ``queue.sentence``. No worker runs beside this server, so what it says
    depends on the module's other jobs (queued for ever, ahead of it): in time, or no start can be promised."""
    due = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = spec_file(tmp_path, **{"batch_size: 8": "batch_size: 7", "max_queue_wait_s: 600": f"deadline: '{due}'"})
    _finished(server, submit(kiln, path), step_s=0.05, startup_s=4.0)
    shown = kiln("estimate", str(path))
    assert shown.exit_code == 0, shown.output
    sentence = next(line for line in shown.stdout.splitlines() if line.startswith("Counting the queue:"))
    queue = json.loads(kiln("estimate", str(path), "-o", "json").stdout)["queue"]
    assert queue["sentence"] == sentence and queue["option"] == 0
    assert queue["verdict"] in ("meets", "unknown")
    assert ("cannot be known" in sentence) == (queue["verdict"] == "unknown"), sentence
    no_deadline = spec_file(tmp_path, **{"batch_size: 8": "batch_size: 7"})
    assert json.loads(kiln("estimate", str(no_deadline), "-o", "json").stdout)["queue"] is None
