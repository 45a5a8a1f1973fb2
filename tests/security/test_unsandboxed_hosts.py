"""A host that cannot sandbox never runs a team's own code, and one whose operator turned the sandbox off says so on
every job it runs (workers/isolation.py).

* A worker whose bubblewrap is missing (``KILN_SANDBOX_BWRAP`` names no binary) says why when it starts and on its
  host (``kiln hosts``: unavailable); it still runs kiln's own recipes, each job saying it ran unsandboxed, while a
  job of uploaded code waits as Unschedulable with the reason, and starts as soon as a host that sandboxes joins.
* A worker with ``KILN_ISOLATION=none`` runs everything, and every job it runs has an UNSANDBOXED event.

Real PostgreSQL, Redis and `python -m workers` processes as root, the trainer on CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from core.models import Host
from core.settings import get_settings
from harness.workers_cluster import Cluster, cluster_on_new_database, tiny_spec, wait_for
from tests.security.test_hostile_code import finished
from tests.security.test_script_isolation import script_job
from tests.support.cluster_rows import job_events, job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOSTILE = Path(__file__).parent / "hostile"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_on_new_database(tmp_path, "kiln_unsandboxed", lease_s=8.0) as c:
        yield c


def host_row(c: Cluster, name: str) -> Host | None:
    with c.sessionmaker()() as db:
        return db.scalars(select(Host).where(Host.name == c.host(name))).first()


def test_a_host_that_cannot_sandbox_runs_kilns_recipes_only(cluster: Cluster) -> None:
    c = cluster
    c.start_worker("nobox", cpu_slots=2, KILN_SANDBOX_BWRAP="/nonexistent/bwrap")
    wait_for(lambda: (h := host_row(c, "nobox")) is not None and h.isolation == "unavailable", 60, "the host said")
    recipe = c.submit_job(tiny_spec("recipe", steps=10, every_steps=5))
    code = script_job(c, "attackers", HOSTILE, ["python", "train.py", "commit"], "code")
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: finished(c, recipe), 150, "kiln's recipe ran on the host that cannot sandbox")
        wait_for(lambda: job_row(c, code).pending_reason == "Unschedulable", 30, "the code job said why it waits")
        waiting = job_row(c, code)
        assert waiting.state == "QUEUED" and "none sandboxes attempts" in (waiting.pending_message or ""), waiting
        c.start_worker("box", cpu_slots=1)
        wait_for(lambda: finished(c, code), 150, "the code job ran once a host that sandboxes joined")
    finally:
        sched.stop()

    assert job_row(c, recipe).state == "SUCCEEDED", job_row(c, recipe).exit_reason
    said = job_events(c, recipe, "UNSANDBOXED")
    assert said and "KILN_SANDBOX_BWRAP=/nonexistent/bwrap is not an executable file" in said[0].message
    job = job_row(c, code)
    assert job.state == "SUCCEEDED", job.exit_reason
    assert not job_events(c, code, "UNSANDBOXED")
    assert any(c.host("box") in e.message for e in job_events(c, code, "RUNNING"))
    nobox = host_row(c, "nobox")
    assert nobox is not None and "not an executable file" in (nobox.isolation_note or "")
    assert "this host cannot sandbox attempts" in c.log_text(c.host("nobox"))


def test_a_host_with_the_sandbox_turned_off_says_so_on_every_job(cluster: Cluster) -> None:
    c = cluster
    c.start_worker("off", cpu_slots=2, KILN_ISOLATION="none")
    code = script_job(c, "attackers", HOSTILE, ["python", "train.py", "commit"], "code")
    recipe = c.submit_job(tiny_spec("recipe", steps=10, every_steps=5))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: finished(c, code, recipe), 150, "both jobs ran")
    finally:
        sched.stop()
    for job_id in (code, recipe):
        assert job_row(c, job_id).state == "SUCCEEDED", job_row(c, job_id).exit_reason
        said = job_events(c, job_id, "UNSANDBOXED")
        assert said and "KILN_ISOLATION=none" in said[0].message, said
    host = host_row(c, "off")
    assert host is not None and host.isolation == "none"
    log = (get_settings().resolved_storage_dir / "logs" / str(code) / "1.log").read_text()
    assert "NOT SANDBOXED" in log
