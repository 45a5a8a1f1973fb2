"""The CLI against the real API: a uvicorn subprocess on a SQLite file in a temporary KILN_HOME.

No scheduler or worker runs here, so jobs stay QUEUED (until cancelled); `tests/e2e/test_kiln_up.py` covers
the whole way of a job.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.client import KilnClient
from cli.config import CliConfig
from cli.errors import ExitCode
from cli.main import app
from cli.server.bootstrap import bootstrap
from core.db import make_engine
from core.migrate import upgrade
from core.models import Host, Job
from core.services.forecasts import record_forecast
from harness.deps import require_module
from harness.services import free_port, wait_until_serving
from tests.support.compile_events import SUMMARIES, relay_compiles

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt-tiny.yaml"


@dataclass(frozen=True)
class Server:
    url: str
    token: str
    home: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("kiln-home")
    db_url = f"sqlite:///{home / 'kiln.db'}"
    upgrade(db_url)
    token = bootstrap(db_url, name="admin").token
    port = free_port()
    env = dict(os.environ, KILN_HOME=str(home), KILN_DATABASE_URL=db_url, KILN_RATE_LIMIT_BURST="100000")
    log = (home / "api.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{url}/readyz", proc, timeout=60, log=home / "api.log")
        yield Server(url, token, home)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


@pytest.fixture
def kiln(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run a kiln command as the admin against the server; returns the CliRunner result."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("KILN_API_URL", server.url)
    monkeypatch.setenv("KILN_TOKEN", server.token)
    runner = CliRunner()

    def run(*args: str, token: str | None = None) -> Any:
        extra = ["--token", token] if token else []
        return runner.invoke(app, [*extra, *args], terminal_width=250)

    return run


def as_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def submit(kiln: Any, path: Path = EXAMPLE) -> int:
    result = kiln("submit", str(path), "-o", "json")
    return int(as_json(result)["id"])


def spec_file(tmp_path: Path, **changes: str) -> Path:
    text = EXAMPLE.read_text()
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def test_login_verifies_and_saves_owner_only(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("KILN_TOKEN", raising=False)
    monkeypatch.delenv("KILN_API_URL", raising=False)
    runner = CliRunner()
    bad = runner.invoke(app, ["login", "--url", server.url, "--token", "kiln_wrong"])
    assert bad.exit_code == ExitCode.UNAUTHORIZED
    assert not (tmp_path / "xdg" / "kiln" / "config.json").exists()
    ok = runner.invoke(app, ["login", "--url", server.url, "--token", server.token])
    assert ok.exit_code == 0, ok.output
    path = tmp_path / "xdg" / "kiln" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"api_url": server.url, "token": server.token}
    me = runner.invoke(app, ["whoami", "-o", "json"])  # from the saved config alone
    assert as_json(me)["name"] == "admin"
    assert runner.invoke(app, ["logout"]).exit_code == 0
    anonymous = runner.invoke(app, ["ls"])
    assert anonymous.exit_code == ExitCode.UNAUTHORIZED
    assert "kiln login" in anonymous.output


def test_submit_ls_describe_events_why(kiln: Any) -> None:
    result = kiln("submit", str(EXAMPLE))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("submitted job ")
    job_id = int(result.stdout.split()[2])

    listed = as_json(kiln("ls", "-o", "json"))
    assert job_id in [j["id"] for j in listed]
    table = kiln("ls")
    assert table.exit_code == 0 and "gpt-tiny" in table.stdout and "QUEUED" in table.stdout

    described = as_json(kiln("describe", str(job_id), "-o", "json"))
    assert described["job"]["state"] == "QUEUED"
    assert described["job"]["spec"]["name"] == "gpt-tiny"
    assert described["sla"]["qos"] == "silver"
    assert described["sla"]["max_queue_wait_s"] == 600
    assert "SUBMITTED" in [e["type"] for e in described["events"]]
    text = kiln("describe", str(job_id))
    assert text.exit_code == 0
    for fragment in (f"Job {job_id}", "gpt-tiny", "QUEUED", "SLA", "Recent events", "SUBMITTED"):
        assert fragment in text.stdout

    events = as_json(kiln("events", str(job_id), "-o", "json"))
    assert events[0]["type"] == "SUBMITTED"
    assert "SUBMITTED" in kiln("events", str(job_id)).stdout

    why = as_json(kiln("why", str(job_id), "-o", "json"))
    assert why["state"] == "QUEUED"
    assert kiln("why", str(job_id)).exit_code == 0

    no_logs = kiln("logs", str(job_id))
    assert no_logs.exit_code == 0
    assert "no logs yet" in no_logs.output


def test_ls_filters_and_pagination(server: Server, kiln: Any, tmp_path: Path) -> None:
    ids = [submit(kiln, spec_file(tmp_path, **{"name: gpt-tiny": f"name: page-{i}"})) for i in range(4)]  # 5 jobs
    gold = submit(kiln, spec_file(tmp_path, **{"name: gpt-tiny": "name: golden", "qos: silver": "qos: gold"}))
    assert [j["id"] for j in as_json(kiln("ls", "--limit", "2", "-o", "json"))] == [gold, ids[-1]]  # newest first
    assert [j["id"] for j in as_json(kiln("ls", "--qos", "gold", "-o", "json"))] == [gold]
    assert [j["id"] for j in as_json(kiln("ls", "--name", "page-1", "-o", "json"))] == [ids[1]]
    everything = as_json(kiln("ls", "--all", "-o", "json"))
    assert set(ids + [gold]) <= {j["id"] for j in everything}
    assert as_json(kiln("ls", "--state", "succeeded", "-o", "json")) == []
    assert {j["state"] for j in as_json(kiln("ls", "-s", "QUEUED,RUNNING", "-a", "-o", "json"))} == {"QUEUED"}
    assert {j["team"] for j in as_json(kiln("ls", "--team", "default", "-o", "json"))} == {"default"}
    assert {j["id"] for j in as_json(kiln("ls", "--since", "1h", "-a", "-o", "json"))} >= set(ids + [gold])
    assert as_json(kiln("ls", "--until", "1h", "-o", "json")) == []  # all submitted within the hour
    assert as_json(kiln("ls", "--since", "2020-01-01", "--until", "2020-01-02T00:00+01:00", "-o", "json")) == []
    bad = kiln("ls", "--since", "yesterday")
    assert bad.exit_code == ExitCode.USAGE and "neither a time ago" in bad.output
    # cursors: three pages of two
    with KilnClient(CliConfig(server.url, server.token, "t", "t")) as api:
        paged = [j["id"] for j in api.paginate("/v1/jobs", {}, limit=5, page_size=2)]
    assert paged == sorted(paged, reverse=True) and len(paged) == 5 and len(set(paged)) == 5


def test_cancel_then_cancel_again_conflicts(kiln: Any) -> None:
    job_id = submit(kiln)
    result = kiln("cancel", str(job_id), "--reason", "not needed")
    assert result.exit_code == 0, result.output
    assert "CANCELLED" in result.stdout
    again = kiln("cancel", str(job_id))
    assert again.exit_code == ExitCode.CONFLICT
    assert "conflict" in again.output


def test_follow_exits_non_zero_when_the_job_is_cancelled(server: Server, tmp_path: Path) -> None:
    env = dict(os.environ, KILN_API_URL=server.url, KILN_TOKEN=server.token, XDG_CONFIG_HOME=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "submit", str(EXAMPLE), "--follow"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("submitted job "), first
    job_id = int(first.split()[2])
    with KilnClient(CliConfig(server.url, server.token, "t", "t")) as api:
        api.post(f"/v1/jobs/{job_id}/cancel")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == ExitCode.FAILURE, err
    assert f"job {job_id} CANCELLED" in err


def test_errors_map_to_exit_codes(server: Server, kiln: Any, tmp_path: Path) -> None:
    missing = kiln("describe", "999999")
    assert missing.exit_code == ExitCode.NOT_FOUND
    assert "not found" in missing.output and "Traceback" not in missing.output

    bad_token = kiln("ls", token="kiln_not_a_real_token")
    assert bad_token.exit_code == ExitCode.UNAUTHORIZED

    # valid locally, refused by the server: the field path comes back
    unknown_qos = kiln("submit", str(spec_file(tmp_path, **{"qos: silver": "qos: platinum"})))
    assert unknown_qos.exit_code == ExitCode.INVALID, unknown_qos.output
    assert "  - sla.qos:" in unknown_qos.output

    other_team = kiln("submit", str(spec_file(tmp_path, **{"team: default": "team: nobody"})))
    assert other_team.exit_code in (ExitCode.NOT_FOUND, ExitCode.INVALID), other_team.output


def test_viewer_is_forbidden_to_submit(server: Server, kiln: Any) -> None:
    with KilnClient(CliConfig(server.url, server.token, "t", "t")) as api:
        api.post("/v1/users", json={"name": "vera"})
    assert kiln("teams", "add-member", "default", "vera", "--role", "viewer").exit_code == 0
    created = as_json(kiln("tokens", "create", "vera-laptop", "--user", "vera", "-o", "json"))
    secret = created["secret"]
    members = as_json(kiln("teams", "members", "default", "-o", "json"))
    assert {"user": "vera", "role": "viewer"}.items() <= next(m for m in members if m["user"] == "vera").items()
    refused = kiln("submit", str(EXAMPLE), token=secret)
    assert refused.exit_code == ExitCode.FORBIDDEN, refused.output
    assert "forbidden" in refused.output
    assert kiln("ls", token=secret).exit_code == 0  # viewers read
    # revoking the token locks vera out
    assert kiln("tokens", "revoke", str(created["id"])).exit_code == 0
    assert kiln("ls", token=secret).exit_code == ExitCode.UNAUTHORIZED


def test_teams_qos_sla_tokens_hosts_usage(kiln: Any) -> None:
    qos = as_json(kiln("qos", "-o", "json"))
    assert {"gold", "silver", "bronze", "best-effort"} <= {q["name"] for q in qos}
    qos_table = kiln("qos").stdout
    assert "gold" in qos_table and "GB/s" in qos_table

    created = kiln("teams", "create", "research", "--quota", "cpu=2", "--quota", "H200=8:borrow=4:lend=2")
    assert created.exit_code == 0, created.output
    team = as_json(kiln("teams", "show", "research", "-o", "json"))
    assert {(q["gpu_type"], q["nominal"], q["borrowing_limit"], q["lending_limit"]) for q in team["quotas"]} == {
        ("cpu", 2, None, None),
        ("H200", 8, 4, 2),
    }
    assert "research" in kiln("teams").stdout
    assert kiln("teams", "create", "research").exit_code == ExitCode.CONFLICT
    raised = kiln("teams", "set", "research", "--quota", "h200=16", "-o", "json")  # one type, the others kept
    assert {(q["gpu_type"], q["nominal"]) for q in as_json(raised)["quotas"]} == {("cpu", 2), ("H200", 16)}

    before = as_json(kiln("sla", "show", "default", "-o", "json"))
    after = as_json(kiln("sla", "set", "default", "--max-queue-wait", "120", "--max-restarts", "5", "-o", "json"))
    assert after["max_queue_wait_s"] == 120 and after["max_restarts"] == 5
    assert after["qos"] == before["qos"]  # terms not given are kept
    assert after["step_time_tolerance"] == before["step_time_tolerance"]
    assert "max_queue_wait_s" in kiln("sla").stdout  # the caller's only team

    listed = as_json(kiln("tokens", "-o", "json"))
    assert "bootstrap" in [t["name"] for t in listed]
    assert as_json(kiln("hosts", "-o", "json")) == []
    assert as_json(kiln("hosts", "--gpus", "-o", "json")) == []
    usage = as_json(kiln("usage", "-o", "json"))
    assert "default" in [t["team"] for t in usage["teams"]]
    assert kiln("usage").exit_code == 0


def test_describe_says_each_attempts_compile_and_usage_the_teams_hit_rate(
    kiln: Any, server: Server, tmp_path: Path
) -> None:
    assert kiln("teams", "create", "compilers", "--quota", "cpu=2").exit_code == 0
    job_id = submit(kiln, spec_file(tmp_path, **{"team: default": "team: compilers", 'mode: "off"': "mode: auto"}))
    # The trainer's compile events of five attempts, written by the worker's own relay into the server's database.
    engine = make_engine(f"sqlite:///{server.home / 'kiln.db'}")
    with Session(engine) as db:
        job = db.get(Job, job_id)
        assert job is not None
        relay_compiles(db, job)
        db.commit()
    engine.dispose()

    text = kiln("describe", str(job_id)).stdout
    for number, summary in enumerate(SUMMARIES, start=1):
        assert f"attempt {number}  compile: {summary}" in text, text
    attempts = as_json(kiln("describe", str(job_id), "-o", "json"))["attempts"]
    assert attempts[2]["compile"]["saved_s"] == 21.3 and attempts[2]["compile"]["source"] == "team"

    usage = kiln("usage", "--team", "compilers")
    assert "COMPILE HITS" in usage.stdout and "2/4 (50%)" in usage.stdout and "21s" in usage.stdout, usage.stdout
    reuse = as_json(kiln("usage", "--team", "compilers", "-o", "json"))["teams"][0]["compile_cache"]
    assert (reuse["compiled"], reuse["hits"], reuse["hit_rate"], reuse["rejected"]) == (4, 2, 0.5, 1)


def test_usage_says_how_far_the_forecasts_were_from_what_happened(kiln: Any, server: Server, tmp_path: Path) -> None:
    assert kiln("teams", "create", "forecasters", "--quota", "cpu=2").exit_code == 0
    ids = [submit(kiln, spec_file(tmp_path, **{"team: default": "team: forecasters"})) for _ in range(2)]
    # What the scheduler and the trainer forecast for the team's two jobs, and what the jobs then measured.
    engine = make_engine(f"sqlite:///{server.home / 'kiln.db'}")
    with Session(engine) as db:
        for job_id, (start, started, memory, peak) in zip(
            ids, [(60, 300, 100e6, 110e6), (0, 2, 50e6, 50e6)], strict=True
        ):
            job = db.get(Job, job_id)
            assert job is not None
            rows = [
                record_forecast(
                    db, job=job, kind="start_time", source="scheduler", predicted=start, predicted_high=600
                ),
                record_forecast(db, job=job, kind="peak_memory", source="trainer", predicted=memory),
            ]
            for row, actual in zip(rows, (started, peak), strict=True):
                row.actual, row.settled_at = actual, row.made_at
        db.commit()
    engine.dispose()

    lines = kiln("usage", "--team", "forecasters").stdout.splitlines()
    assert any("Forecasts against what happened" in line for line in lines), lines
    start = next(line for line in lines if line.startswith("start time"))
    assert start.split()[2:] == ["scheduler", "2", "0", "2", "2s", "4m00s", "+2s", "-", "-", "2/2"], start
    memory = next(line for line in lines if line.startswith("peak memory"))
    assert memory.split()[2:] == ["trainer", "2", "0", "2", "0", "B", "9.5", "MiB", "0", "B", "0.0%", "9.1%", "-"], (
        memory
    )
    errors = as_json(kiln("usage", "--team", "forecasters", "-o", "json"))["forecasts"]
    assert [(e["kind"], e["p90_abs_error"]) for e in errors] == [("start_time", 240.0), ("peak_memory", 10e6)]
    # The job's own, in kiln describe: the start as times (forecast at its submission), the memory as sizes.
    described = kiln("describe", str(ids[0])).stdout
    assert "forecast: start time" in described and "(+4m00s) (scheduler)" in described, described
    assert "forecast: peak memory  95.4 MiB, measured 104.9 MiB (+9.5 MiB, 9.1%) (trainer)" in described, described


def test_cancel_several_jobs_or_a_filter(kiln: Any, server: Server, tmp_path: Path) -> None:
    named = spec_file(tmp_path, **{"name: gpt-tiny": "name: batch-cancel"})
    ids = [submit(kiln, named) for _ in range(3)]
    both = kiln("cancel", str(ids[0]), str(ids[1]), "--reason", "wrong lr")
    assert both.exit_code == 0, both.output
    assert both.stdout.splitlines() == [f"job {ids[0]} CANCELLED", f"job {ids[1]} CANCELLED"]
    # Already cancelled: that one is reported, the others still go ahead, and the exit code says so.
    mixed = kiln("cancel", str(ids[0]), str(ids[2]))
    assert mixed.exit_code == ExitCode.CONFLICT and f"job {ids[2]} CANCELLED" in mixed.stdout
    assert f"job {ids[0]}:" in mixed.stderr
    left = submit(kiln, named)
    by_filter = kiln("cancel", "--name", "batch-cancel", "--mine")
    assert by_filter.exit_code == 0 and by_filter.stdout.splitlines() == [f"job {left} CANCELLED"]
    assert kiln("cancel", "--name", "batch-cancel").stderr.strip() == "no active job matches"
    recent = submit(kiln, named)
    assert kiln("cancel", "--name", "batch-cancel", "--until", "2020-01-01").stderr.strip() == "no active job matches"
    by_time = kiln("cancel", "--name", "batch-cancel", "--since", "1h")
    assert by_time.exit_code == 0 and by_time.stdout.splitlines() == [f"job {recent} CANCELLED"]
    assert kiln("cancel").exit_code == ExitCode.USAGE


def test_hold_and_release_by_id_or_filter(kiln: Any, server: Server, tmp_path: Path) -> None:
    named = spec_file(tmp_path, **{"name: gpt-tiny": "name: batch-hold"})
    first, second = submit(kiln, named), submit(kiln, named)
    one = kiln("hold", str(first), "--reason", "dataset not ready")
    assert one.exit_code == 0 and one.stdout.splitlines() == [f"job {first} held (kiln release {first} lets it start)"]
    shown = kiln("describe", str(first))
    assert "Held: held by admin (admin): dataset not ready" in shown.stdout and "(paused while held)" in shown.stdout
    assert "release it: kiln release" in kiln("why", str(first)).stdout
    again = kiln("hold", str(first)).stdout.strip()
    assert again == f"job {first} is held already (held by admin (admin): dataset not ready)"
    assert "held " in kiln("ls", "--name", "batch-hold").stdout  # the TIME column: held for how long
    rest = kiln("hold", "--name", "batch-hold")  # the one not held yet
    assert rest.stdout.splitlines() == [f"job {second} held (kiln release {second} lets it start)"]
    assert kiln("hold", "--name", "batch-hold").stderr.strip() == "no queued job matches"
    listed = as_json(kiln("ls", "--name", "batch-hold", "-o", "json"))
    assert [(j["pending_reason"], bool(j["held_at"])) for j in listed] == [("Held", True)] * 2
    assert [j["id"] for j in as_json(kiln("ls", "--held", "-o", "json"))][:2] == [second, first]
    back = kiln("release", "--name", "batch-hold", "--mine")
    assert back.exit_code == 0 and sorted(back.stdout.splitlines()) == sorted(
        f"job {i} released: the scheduler plans it again" for i in (first, second)
    )
    assert kiln("release", str(first)).stdout.strip() == f"job {first} is not held (QUEUED)"
    assert kiln("release", "--name", "batch-hold").stderr.strip() == "no held job matches"
    kiln("cancel", str(first))
    refused = kiln("hold", str(first))
    assert refused.exit_code == ExitCode.CONFLICT and "only a queued or running job can be held" in refused.stderr
    later = kiln("submit", "--hold", str(named), "-o", "json")
    assert later.exit_code == 0 and json.loads(later.stdout)["pending_reason"] == "Held"
    assert kiln("release").exit_code == ExitCode.USAGE


def test_update_changes_a_queued_jobs_class_time_limit_gpus_and_dependencies(kiln: Any, server: Server) -> None:
    job = submit(kiln)
    changed = kiln("update", str(job), "--qos", "bronze", "--time-limit", "2h")
    assert changed.exit_code == 0, changed.output
    assert changed.stdout.strip() == f"job {job}: qos bronze (priority 200), gpus 0, time limit 2h00m"
    assert "qos silver -> bronze; time_limit none -> 7200 s (by admin)" in kiln("events", str(job)).stdout
    assert kiln("update", str(job), "--time-limit", "none").stdout.strip().endswith("time limit none")
    assert kiln("update", str(job), "--time-limit", "soon").exit_code == ExitCode.USAGE
    assert kiln("update", str(job)).exit_code == ExitCode.USAGE
    refused = kiln("update", str(job), "--qos", "platinum")
    assert refused.exit_code == ExitCode.INVALID and "unknown QoS class 'platinum'" in refused.stderr
    assert kiln("update", str(job), "--gpus", "-1").exit_code == ExitCode.USAGE
    later = submit(kiln)
    waits = kiln("update", str(later), "--depends-on", f"afterok:{job}")
    assert waits.exit_code == 0 and waits.stdout.strip().endswith(f"depends on afterok:{job}"), waits.output
    cycle = kiln("update", str(job), "--depends-on", str(later))
    assert cycle.exit_code == ExitCode.INVALID and "would wait for itself" in cycle.stderr
    assert kiln("update", str(later), "--depends-on", "none").stdout.strip().endswith("depends on nothing")


def test_ls_mine_and_user_and_yaml_output(kiln: Any, server: Server) -> None:
    job_id = submit(kiln)
    mine = as_json(kiln("ls", "--mine", "-o", "json"))
    assert job_id in [j["id"] for j in mine] and {j["user"] for j in mine} == {"admin"}
    assert as_json(kiln("ls", "--user", "nobody-here", "-o", "json")) == []
    shown = kiln("describe", str(job_id), "-o", "yaml")
    assert shown.exit_code == 0, shown.output
    import yaml

    assert yaml.safe_load(shown.stdout)["job"]["id"] == job_id


def test_why_says_what_the_job_waits_for(kiln: Any) -> None:
    job_id = submit(kiln)  # no scheduler runs here: never planned
    result = kiln("why", str(job_id))
    assert result.exit_code == 0, result.output
    assert "QUEUED and not planned yet" in result.stdout
    assert "expected start: cannot be known: it does not start even once every running job has ended" in result.stdout
    assert as_json(kiln("why", str(job_id), "-o", "json"))["unblock"] == []


def test_clone_with_changes(kiln: Any) -> None:
    job_id = submit(kiln)
    cloned = kiln(
        "clone",
        str(job_id),
        "--set",
        "recipe.hyperparameters.lr=0.001",
        "-s",
        "steps=30",
        "--name",
        "tiny-clone",
        "-o",
        "json",
    )
    job = as_json(cloned)
    assert job["id"] != job_id and job["name"] == "tiny-clone" and job["steps"] == 30
    assert job["spec"]["recipe"]["hyperparameters"]["lr"] == 0.001
    bad = kiln("clone", str(job_id), "--set", "resources.gpus=-1")
    assert bad.exit_code == ExitCode.INVALID and "resources.gpus" in bad.output
    assert kiln("clone", str(job_id), "--set", "nokey").exit_code == ExitCode.USAGE


def test_sweep_submit_show_and_ls(kiln: Any, tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(EXAMPLE.read_text() + "sweep:\n  grid: {lr: [0.001, 0.003], steps: [5, 6]}\n  max_concurrent: 2\n")
    made = kiln("sweep", "submit", str(path))
    assert made.exit_code == 0, made.output
    assert "4 jobs, at most 2 at once" in made.stdout
    sweep_id = int(made.stdout.split()[2])
    shown = kiln("sweep", "show", str(sweep_id))
    assert shown.exit_code == 0, shown.output
    header = shown.stdout.splitlines()[1].split()
    assert header[:4] == ["RANK", "ID", "NAME", "STATE"] and {"LR", "STEPS", "LOSS"} <= set(header)
    data = as_json(kiln("sweep", "show", str(sweep_id), "-o", "json"))
    assert len(data["jobs"]) == 4 and data["keys"] == ["lr", "steps"]
    assert sweep_id in [s["id"] for s in as_json(kiln("sweep", "ls", "-o", "json"))]
    by_lr = kiln("sweep", "show", str(sweep_id), "--sort", "-lr")
    assert by_lr.exit_code == 0, by_lr.output
    lrs = [line.split()[header.index("LR")] for line in by_lr.stdout.splitlines()[2:] if line.strip()]
    assert lrs == ["0.003", "0.003", "0.001", "0.001"]
    unknown = kiln("sweep", "show", str(sweep_id), "--sort", "acc")
    assert unknown.exit_code == ExitCode.USAGE and "no such column" in unknown.output and "lr" in unknown.output


def test_a_random_sweep_of_the_teams_own_code_ranked_by_its_metric(kiln: Any) -> None:
    """``kiln sweep submit --workdir DIR --hold``: the code uploaded once for the whole sweep, its jobs held."""
    example = ROOT / "examples" / "digits"
    made = kiln("sweep", "submit", str(example / "sweep.yaml"), "--workdir", str(example), "--hold")
    assert made.exit_code == 0, made.output
    assert "uploaded" in made.stderr and "6 jobs, at most 2 at once (held), drawn with seed 7" in made.stdout
    assert "best first by accuracy (maximize)" in made.stdout
    sweep_id = made.stdout.split()[2]
    data = as_json(kiln("sweep", "show", sweep_id, "-o", "json"))
    assert data["keys"] == ["lr", "channels", "hidden"] and data["parameters"]["seed"] == 7
    digests = {
        as_json(kiln("describe", str(j["id"]), "-o", "json"))["job"]["spec"]["code"]["digest"] for j in data["jobs"]
    }
    assert len(digests) == 1 and None not in digests
    assert {j["pending_reason"] for j in data["jobs"]} == {"Held"}
    again = kiln("sweep", "submit", str(example / "sweep.yaml"), "--workdir", str(example), "-o", "json")
    assert "already uploaded, 0 bytes sent" in again.stderr, again.output
    assert [j["settings"] for j in as_json(again)["jobs"]] == [j["settings"] for j in data["jobs"]]  # seed 7 again
    shown = kiln("sweep", "show", sweep_id)
    assert "best first by accuracy (maximize)" in shown.stdout.splitlines()[0]
    stops = "Stops early by the median rule: a job worse than the median of at least 2 other jobs at a step stops"
    assert shown.stdout.splitlines()[1].strip() == stops, shown.stdout
    assert data["early_stopping"] == stops.removeprefix("Stops early by ")
    listed = kiln("sweep", "ls")
    assert listed.stdout.splitlines()[0].split()[-1] == "BEST", listed.output
    kiln("cancel", "--sweep", sweep_id)
    kiln("cancel", "--sweep", str(as_json(again)["id"]))


def test_an_adaptive_sweep_says_what_it_submitted_now_and_how_it_searches(kiln: Any) -> None:
    example = ROOT / "examples" / "digits"
    made = kiln("sweep", "submit", str(example / "sweep-tpe.yaml"), "--workdir", str(example), "--hold")
    assert made.exit_code == 0, made.output
    assert (
        "4 jobs now, 12 in all by TPE (each next one proposed as others end), at most 2 at once (held), drawn "
        "with seed 7"
    ) in made.stdout, made.stdout
    sweep_id = made.stdout.split()[2]
    searches = (
        "Searches by TPE (tree-structured Parzen estimators): 4 random draws, then each next job's settings "
        "proposed from the jobs that ended, 2 at a time, 12 jobs in all"
    )
    assert kiln("sweep", "show", sweep_id).stdout.splitlines()[2].strip() == searches
    kiln("cancel", "--sweep", sweep_id)
    closed = kiln("sweep", "show", sweep_id).stdout.splitlines()[2].strip()
    assert closed == f"{searches} (proposes no more: cancelled by admin)", closed


def test_sweep_submit_check_runs_the_first_job_before_anything_is_submitted(kiln: Any, tmp_path: Path) -> None:
    require_module("torch")  # --check runs the model: a host that tests has torch (the dev set-up installs it)
    example = ROOT / "examples" / "digits"
    before = len(as_json(kiln("sweep", "ls", "-o", "json")))
    no_section = kiln("sweep", "submit", str(EXAMPLE), "--check")
    assert no_section.exit_code == ExitCode.INVALID and "invalid sweep" in no_section.output, no_section.output
    bad = tmp_path / "sweep.yaml"
    doc = (example / "sweep.yaml").read_text().split("\nsweep:\n")[0] + "\nsweep:\n  list: [{channels: 0}]\n"
    bad.write_text(doc)
    failed = kiln("sweep", "submit", str(bad), "--workdir", str(example), "--check")
    assert failed.exit_code == ExitCode.INVALID and "check failed" in failed.output, failed.output
    assert "channels" in failed.output
    assert len(as_json(kiln("sweep", "ls", "-o", "json"))) == before  # nothing submitted, nothing uploaded


def test_sweep_submit_reads_every_jobs_hyperparameters_by_default(kiln: Any, tmp_path: Path) -> None:
    """Without --check, a sweep of the team's own code has each job's settings read by its Hyperparameters before
    anything is sent (issue 42, point 3): a value only the third job gets is refused, naming that job."""
    require_module("torch")
    example = ROOT / "examples" / "digits"
    before = len(as_json(kiln("sweep", "ls", "-o", "json")))
    bad = tmp_path / "sweep.yaml"
    doc = (example / "sweep.yaml").read_text().split("\nsweep:\n")[0] + "\nsweep:\n  grid: {hidden: [32, 64, 9999]}\n"
    bad.write_text(doc)
    failed = kiln("sweep", "submit", str(bad), "--workdir", str(example))
    assert failed.exit_code == ExitCode.INVALID, failed.output
    assert "check failed: job 3 of the sweep's 3: reading the hyperparameters" in failed.output, failed.output
    assert "hidden" in failed.output
    assert len(as_json(kiln("sweep", "ls", "-o", "json"))) == before  # nothing submitted
    skipped = kiln("sweep", "submit", str(bad), "--workdir", str(example), "--no-check", "--hold", "-o", "json")
    assert skipped.exit_code == 0, skipped.output  # --no-check: the jobs find it out (the third fails at once)
    assert kiln("cancel", "--sweep", str(json.loads(skipped.stdout)["id"])).exit_code == 0


def test_a_sweeps_jobs_are_held_released_and_cancelled_together(kiln: Any, tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(EXAMPLE.read_text() + "sweep:\n  grid: {lr: [0.001, 0.003, 0.01]}\n")
    sweep_id = int(kiln("sweep", "submit", str(path)).stdout.split()[2])
    jobs = [j["id"] for j in as_json(kiln("sweep", "show", str(sweep_id), "-o", "json"))["jobs"]]
    other = kiln("submit", str(EXAMPLE)).stdout.split()[2]  # a job of no sweep, which --sweep never picks
    kiln("hold", str(jobs[0]))
    rest = kiln("hold", "--sweep", str(sweep_id))  # the two not held yet
    assert rest.exit_code == 0 and len(rest.stdout.splitlines()) == 2, rest.output
    reasons = {j["pending_reason"] for j in as_json(kiln("sweep", "show", str(sweep_id), "-o", "json"))["jobs"]}
    assert reasons == {"Held"}
    held = as_json(kiln("ls", "--sweep", str(sweep_id), "--held", "-o", "json"))
    assert sorted(j["id"] for j in held) == sorted(jobs)
    assert kiln("release", "--sweep", str(sweep_id), "--name", "nobody").stderr.strip() == "no held job matches"
    assert len(kiln("release", "--sweep", str(sweep_id), "--mine").stdout.splitlines()) == 3
    assert kiln("release", "--sweep", str(sweep_id)).stderr.strip() == "no held job matches"
    assert not set(jobs) & {j["id"] for j in as_json(kiln("ls", "--held", "-o", "json"))}
    assert int(other) not in [j["id"] for j in as_json(kiln("ls", "--sweep", str(sweep_id), "-o", "json"))]
    cancelled = kiln("cancel", "--sweep", str(sweep_id))
    assert sorted(cancelled.stdout.splitlines()) == sorted(f"job {j} CANCELLED" for j in jobs)


def test_a_sweep_given_alone_is_released_in_one_transaction_or_not_at_all(
    server: Server, kiln: Any, tmp_path: Path
) -> None:
    # kiln release --sweep S is POST /v1/sweeps/S/release: a job its caller may not release refuses them all
    # (before, the CLI released job by job and left the sweep half released).
    with KilnClient(CliConfig(server.url, server.token, "t", "t")) as api:
        api.post("/v1/users", json={"name": "mia"})
    assert kiln("teams", "add-member", "default", "mia", "--role", "member").exit_code == 0
    mia = as_json(kiln("tokens", "create", "mia-laptop", "--user", "mia", "-o", "json"))["secret"]
    path = tmp_path / "sweep.yaml"
    path.write_text(EXAMPLE.read_text() + "sweep:\n  grid: {lr: [0.001, 0.003, 0.01]}\n")
    sweep_id = int(kiln("sweep", "submit", str(path), "--hold", token=mia).stdout.split()[2])
    jobs = sorted(j["id"] for j in as_json(kiln("sweep", "show", str(sweep_id), "-o", "json"))["jobs"])
    kiln("release", str(jobs[0]), token=mia)
    assert kiln("hold", str(jobs[0]), "--reason", "quota review").exit_code == 0  # held by an admin
    refused = kiln("release", "--sweep", str(sweep_id), token=mia)
    assert refused.exit_code == ExitCode.FORBIDDEN, refused.output
    held = sorted(j["id"] for j in as_json(kiln("ls", "--sweep", str(sweep_id), "--held", "-o", "json")))
    assert held == jobs  # none released
    released = kiln("release", "--sweep", str(sweep_id))  # an admin may
    assert sorted(released.stdout.splitlines()) == sorted(
        f"job {j} released: the scheduler plans it again" for j in jobs
    )
    again = kiln("cancel", "--sweep", str(sweep_id), "-o", "json")
    assert again.exit_code == 0 and as_json(again)["id"] == sweep_id, again.output
    assert {j["state"] for j in as_json(again)["jobs"]} == {"CANCELLED"}


def test_sweep_table_has_a_column_per_metric_and_sorts_by_it() -> None:
    from cli.commands.reuse import sweep_rows

    def job(i: int, loss: float | None, metrics: dict[str, float]) -> dict[str, Any]:
        state = "SUCCEEDED" if metrics else "RUNNING"
        return {
            "id": i,
            "name": f"s-{i}",
            "state": state,
            "settings": {"lr": i / 1000},
            "last_step": 10,
            "steps": 10,
            "last_loss": loss,
            "pending_reason": None,
            "metrics": metrics,
        }

    sweep = {
        "keys": ["lr"],
        "jobs": [job(1, 0.2, {"accuracy": 0.91}), job(2, 0.3, {"accuracy": 0.97, "f1": 0.9}), job(3, None, {})],
    }
    columns, rows = sweep_rows(sweep)
    assert [c[0] for c in columns] == ["RANK", "ID", "NAME", "STATE", "LR", "STEP", "LOSS", "ACCURACY", "F1", "REASON"]
    assert [r["id"] for r in rows] == [1, 2, 3]  # the API's order: best first by its objective
    _, by_accuracy = sweep_rows(sweep, "-accuracy")
    assert [r["id"] for r in by_accuracy] == [2, 1, 3]  # a job with no evaluation yet last
    _, by_loss = sweep_rows(sweep, "LOSS")
    assert [r["id"] for r in by_loss] == [1, 2, 3]


def test_cancelling_a_running_job_says_it_stops_after_a_checkpoint(kiln: Any, server: Server) -> None:
    import sqlite3

    job_id = submit(kiln)
    with sqlite3.connect(server.home / "kiln.db") as db:  # no worker here: the job is put where a worker would
        db.execute("UPDATE jobs SET state = 'RUNNING' WHERE id = ?", (job_id,))
    result = kiln("cancel", str(job_id))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"cancelling job {job_id}: stopping, checkpoint first"
    events = as_json(kiln("events", str(job_id), "-o", "json"))
    assert events[-1]["type"] == "CANCEL_REQUESTED"
    assert events[-1]["message"] == "cancelled by admin: stopping, checkpoint first (while RUNNING)"


def test_a_request_no_host_can_ever_run_is_refused_with_the_largest_it_could_hold(
    kiln: Any, server: Server, tmp_path: Path
) -> None:
    """Before any host registers a job is accepted with a warning; once ``kiln up``'s one CPU host (2 slots) has,
    16 CPU slots or a GPU are refused with what the cluster has, exit 7 as for any refused spec."""
    early = kiln("submit", str(EXAMPLE))
    assert early.exit_code == 0, early.output
    assert "warning: waits for capacity not yet joined: no host has registered yet" in early.output
    engine = make_engine(f"sqlite:///{server.home / 'kiln.db'}")
    try:
        with Session(engine) as db:
            db.add(Host(name="laptop", queue="host.laptop", cpu_slots=2, links={}))
            db.commit()
        wide = kiln("submit", str(spec_file(tmp_path, **{"cpu_slots: 1": "cpu_slots: 16"})))
        assert wide.exit_code == ExitCode.INVALID, wide.output
        assert (
            "  - resources.cpu_slots: requests 16 CPU slots; the whole cluster has 2 (2 CPU slots a host, 1 host): "
            "ask for at most 2" in wide.output
        ), wide.output
        gpu = kiln("submit", str(spec_file(tmp_path, **{"gpus: 0": "gpus: 64\n  gpu_type: H300"})))
        assert gpu.exit_code == ExitCode.INVALID, gpu.output
        assert "no host has GPU type H300 (the cluster has 2 CPU slots a host, 1 host)" in gpu.output, gpu.output
        fits = kiln("submit", str(EXAMPLE))
        assert fits.exit_code == 0 and "warning" not in fits.output, fits.output
    finally:
        with Session(engine) as db:  # the module's other tests run on a cluster without hosts
            db.execute(delete(Host).where(Host.name == "laptop"))
            db.commit()
        engine.dispose()


def test_a_cancels_reason_is_kept_and_why_and_describe_say_it(kiln: Any) -> None:
    job_id = submit(kiln)
    assert kiln("cancel", str(job_id), "--reason", "wrong lr").exit_code == 0
    said = as_json(kiln("describe", str(job_id), "-o", "json"))["job"]["exit_reason"]
    assert said.startswith("cancelled by ") and said.endswith(": wrong lr"), said
    assert f"job {job_id} is CANCELLED: {said}" in kiln("why", str(job_id)).stdout  # was "not waiting"
    assert said in kiln("describe", str(job_id)).stdout


def test_the_prometheus_recipe_of_docs_cli_md_works(kiln: Any, server: Server) -> None:
    """docs/cli.md's scrape token for Prometheus: the metrics user is made with `kiln users create` (issue 42, point
    6: no command made it, so `kiln tokens create ... --user prometheus` exited 6), then its metrics-only token reads
    /metrics and nothing else."""
    import httpx

    created = kiln("users", "create", "prometheus")
    assert created.exit_code == 0 and "user prometheus created" in created.stdout, created.output
    assert "prometheus" in kiln("users").stdout
    token = as_json(kiln("tokens", "create", "prometheus", "--scope", "metrics", "--user", "prometheus", "-o", "json"))
    secret = {"Authorization": f"Bearer {token['secret']}"}
    scraped = httpx.get(f"{server.url}/metrics", headers=secret, timeout=30)
    assert scraped.status_code == 200 and "kiln_jobs" in scraped.text
    assert httpx.get(f"{server.url}/v1/jobs", headers=secret, timeout=30).status_code == 403  # scrape-only


def test_hints_name_the_command_as_the_user_types_it(kiln: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a fresh clone the command is ./kiln (its wrapper says so in KILN_CLI_NAME): a hint to run another command
    can be pasted as printed (issue 42, point 6)."""
    monkeypatch.setenv("KILN_CLI_NAME", "./kiln")
    job_id = submit(kiln)
    held = kiln("hold", str(job_id))
    assert f"job {job_id} held (./kiln release {job_id} lets it start)" in held.stdout, held.output
    assert kiln("cancel", str(job_id)).exit_code == 0


def test_describe_shows_the_commands_own_exit_code(kiln: Any, server: Server) -> None:
    """A script that exits 1: its rank records USER_ERROR (2), kiln's code, which the attempt keeps; describe's
    EXIT column said 2 where the timeline said "the command exited with 1" (issue 42, point 7)."""
    from core.models import Attempt
    from rank.script import classify_exit, ended
    from tests.support.compile_events import event
    from workers.telemetry_relay import RelayState, relay

    job_id = submit(kiln)
    engine = make_engine(f"sqlite:///{server.home / 'kiln.db'}")
    with Session(engine) as db:
        job = db.get(Job, job_id)
        assert job is not None
        attempt = Attempt(
            job_id=job.id, number=1, fencing_token=1, placement=[{"host": "h1", "gpus": [], "slots": 2}], state="FAILED"
        )
        db.add(attempt)
        db.flush()
        records = []
        for rank, returncode in ((1, 3), (0, 1)):  # as rank.script.run emits them; the attempt's code is rank 0's
            code, error = classify_exit(returncode, "ValueError: lr must be > 0", None)
            records.append(event("EXIT", rank, exit_code=code, error=error, returncode=returncode))
            records[-1]["message"] = ended(returncode, code)
        relay(db, job=job, attempt=attempt, records=records, state=RelayState())
        attempt.exit_code = code  # what the worker records: rank 0's code
        db.commit()
    engine.dispose()
    assert code == 2

    text = kiln("describe", str(job_id)).stdout
    header = next(line for line in text.splitlines() if "PLACEMENT" in line)
    row = next(line for line in text.splitlines() if "FAILED" in line and "h1" in line)
    assert row[header.index("EXIT") :].split()[0] == "1", text
    assert as_json(kiln("describe", str(job_id), "-o", "json"))["attempts"][0]["exit_code"] == 2  # the API's, as is


def test_login_signs_in_where_every_command_goes(kiln: Any, server: Server) -> None:
    """Without --url, `kiln login` (and --sso) went to the default address, not KILN_API_URL or the saved URL that
    every other command uses: after `kiln up --port N`, `kiln login --sso` said it could not reach 127.0.0.1:8421."""
    result = kiln("login", "--sso")  # KILN_API_URL is the server's (the fixture); it has no OpenID provider
    assert result.exit_code == ExitCode.NOT_FOUND, result.output
    assert f"{server.url} signs no one in with a provider" in result.output, result.output
