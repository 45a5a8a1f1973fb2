"""/metrics with several API worker processes (``uvicorn --workers 2``, as docker-compose runs 4): with
``PROMETHEUS_MULTIPROC_DIR`` every scrape reports the requests all processes served, not the share of whichever
process answered the scrape; the latency is a real histogram (cumulative buckets, ``_count`` = the requests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.dashboard import ROOT, prepare_home
from harness.services import free_port, wait_until_serving

pytestmark = pytest.mark.e2e


def _sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _pids_that_counted(directory: Path) -> set[str]:
    return {m.group(1) for p in directory.iterdir() if (m := re.fullmatch(r"counter_(\d+)\.db", p.name))}


def test_every_scrape_counts_every_process(tmp_path: Path) -> None:
    url, token = prepare_home(tmp_path)
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "KILN_HOME": str(tmp_path),
        "KILN_DATABASE_URL": url,
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
    }
    log = open(tmp_path / "api.log", "wb")  # noqa: SIM115 - closed below
    api = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "api.app:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{base}/healthz", api, timeout=60, log=tmp_path / "api.log")
        sent = 1
        # New connections until both processes have served some (the kernel spreads accepts between them).
        while len(_pids_that_counted(multiproc)) < 2:
            assert sent < 2000, "one process served every request"
            assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
            sent += 1
        headers = {"Authorization": f"Bearer {token}"}
        for _ in range(4):  # whichever process answers the scrape, it reports every process's requests
            body = httpx.get(f"{base}/metrics", headers=headers, timeout=10).text
            assert _sample(body, "kiln_http_requests_total", route="/healthz", status="200") == sent
            assert _sample(body, "kiln_http_request_duration_seconds_count", route="/healthz") == sent
            assert _sample(body, "kiln_http_request_duration_seconds_bucket", route="/healthz", le="+Inf") == sent
            assert "kiln_jobs{" in body and 'pid="' not in body
    finally:
        api.terminate()
        api.wait(timeout=20)
        log.close()
