"""A client generated from the published OpenAPI document by a third-party tool (openapi-python-client) drives the
API on PostgreSQL: submit, list, get, events and cancel (with and without its optional body), and an error comes
back as the typed Problem."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.support.api import World, auth, spec

pytestmark = pytest.mark.integration

PACKAGE = "kiln_generated_client"
# The generator has no writer for YAML bodies: POST /v1/jobs's YAML media types are the only thing it may skip.
ALLOWED_WARNINGS = {
    "Unsupported content type application/x-yaml",
    "Unsupported content type application/yaml",
    "Unsupported content type text/yaml",
}


def _generate(doc: dict[str, Any], where: Path) -> str:
    (where / "openapi.json").write_text(json.dumps(doc))
    tool = Path(sys.executable).parent / "openapi-python-client"
    env = {**os.environ, "PATH": f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # its ruff pass
    run = subprocess.run(
        [str(tool), "generate", "--path", "openapi.json", "--output-path", PACKAGE, "--meta", "none"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout + run.stderr


@pytest.fixture
def generated(client: TestClient, tmp_path: Path) -> Iterator[ModuleType]:
    output = _generate(client.get("/openapi.json").json(), tmp_path)
    problems = [line for line in output.splitlines() if line.startswith("Unsupported") or line.startswith("Could")]
    assert set(problems) <= ALLOWED_WARNINGS, output
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _api(package: ModuleType, app: FastAPI, token: str) -> Any:
    """The generated client over the test app (an httpx client, as the generator's own would be)."""
    api = package.AuthenticatedClient(base_url="http://testserver", token=token)
    api.set_httpx_client(TestClient(app, base_url="http://testserver", headers=auth(token)))
    return api


def _mod(package: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_generated_client_submits_lists_gets_follows_and_cancels(
    generated: ModuleType, api_app: FastAPI, world: World
) -> None:
    api = _api(generated, api_app, world.tokens["member"])
    models = _mod(generated, "models")
    jobs = {
        name: _mod(generated, f"api.jobs.{name}")
        for name in ("submit_job", "list_jobs", "get_job", "list_job_events", "cancel_job")
    }

    body = models.JobSpec.from_dict(spec(team="alpha", name="generated"))
    job = jobs["submit_job"].sync(client=api, body=body)
    assert isinstance(job, models.JobOut), job
    assert job.state is models.JobState.QUEUED and job.spec.recipe.name == "gpt" and job.team == "alpha"

    page = jobs["list_jobs"].sync(client=api, team="alpha", state=[models.JobState.QUEUED], limit=10)
    assert isinstance(page, models.JobPageOut)
    assert job.id in [j.id for j in page.items]

    got = jobs["get_job"].sync(job.id, client=api)
    assert isinstance(got, models.JobDetailOut) and got.spec.steps == 10 and got.submitted_at == job.submitted_at

    events = jobs["list_job_events"].sync(job.id, client=api)
    assert [e.type_ for e in events.items] == ["SUBMITTED"]

    cancelled = jobs["cancel_job"].sync(job.id, client=api)  # no body: the optional body stays optional
    assert isinstance(cancelled, models.JobOut) and cancelled.state is models.JobState.CANCELLED
    second = jobs["submit_job"].sync(client=api, body=models.JobSpec.from_dict(spec(team="alpha", name="two")))
    with_reason = jobs["cancel_job"].sync(second.id, client=api, body=models.CancelIn(reason="wrong lr"))
    assert with_reason.state is models.JobState.CANCELLED

    timeline = jobs["list_job_events"].sync(second.id, client=api).items
    assert timeline[-1].type_ == "CANCELLED"
    assert timeline[-1].data.to is models.JobState.CANCELLED and timeline[-1].data["reason"] == "wrong lr"


def test_generated_client_reads_errors_as_problems(generated: ModuleType, api_app: FastAPI, world: World) -> None:
    api = _api(generated, api_app, world.tokens["member"])
    models = _mod(generated, "models")
    missing = _mod(generated, "api.jobs.get_job").sync(999_999, client=api)
    assert isinstance(missing, models.Problem) and missing.status == 404
    beta_job = _mod(generated, "api.jobs.cancel_job").sync(world.jobs["beta"], client=api)
    assert isinstance(beta_job, models.Problem) and beta_job.status == 404  # another team's job: not visible
    viewer = _api(generated, api_app, world.tokens["viewer"])
    refused = _mod(generated, "api.jobs.submit_job").sync(
        client=viewer, body=models.JobSpec.from_dict(spec(team="alpha", name="nope"))
    )
    assert isinstance(refused, models.Problem) and refused.status == 403 and refused.detail
