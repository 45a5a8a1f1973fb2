"""The whole kiln system as real subprocesses on a SQLite file in a temp dir, and Debian's Chromium, for the
dashboard's browser tests (tests/e2e/test_dashboard*.py). Nothing is mocked: the browser talks to the API over
HTTP, the scheduler and a worker run as their own processes."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.deps import missing
from harness.services import free_port, wait_until_serving

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("KILN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
DOCS_IMG = ROOT / "docs" / "img"
REFRESH_SCREENSHOTS = "KILN_REFRESH_SCREENSHOTS"  # =1: the screenshots replace the docs' own (docs/img)


@functools.cache
def screenshot_dir() -> Path:
    """Where the browser tests save screenshots: docs/img only when asked (``KILN_REFRESH_SCREENSHOTS=1``), else a
    temporary directory, so a test run never rewrites tracked files."""
    if os.environ.get(REFRESH_SCREENSHOTS) == "1":
        return DOCS_IMG
    return Path(tempfile.mkdtemp(prefix="kiln-screenshots-"))


def require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        missing(f"{CHROMIUM} is missing (apt-get install -y chromium)")


@dataclass
class Kiln:
    home: Path
    url: str
    token: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.home / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_scheduler(self) -> None:
        if "scheduler" not in self.procs:
            self.start("scheduler", "-m", "scheduler")

    def start_worker(self, host: str = "e2e-host", cpu_slots: int = 2) -> None:
        if "worker" not in self.procs:
            self.start("worker", "-m", "workers", "--host", host, "--cpu-slots", str(cpu_slots))

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # its own session: the worker's trainers go with it
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def prepare_home(home: Path) -> tuple[str, str]:
    """Migrate a fresh SQLite database and bootstrap the first admin; returns (database URL, token)."""
    from sqlalchemy.orm import Session

    from core.db import make_engine
    from core.migrate import upgrade
    from core.services.bootstrap import bootstrap_admin

    url = f"sqlite:///{home / 'kiln.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        _, token = bootstrap_admin(db=db, name="admin")
        db.commit()
    engine.dispose()
    return url, token


@contextmanager
def running_kiln(home: Path, **extra_env: str) -> Iterator[Kiln]:
    """The API on a free port (scheduler and worker are started by the tests that need them)."""
    home.mkdir(parents=True, exist_ok=True)
    url, token = prepare_home(home)
    port = free_port()
    env = {
        **os.environ,
        "KILN_HOME": str(home),
        "KILN_DATABASE_URL": url,
        "KILN_PORT": str(port),
        "KILN_API_URL": f"http://127.0.0.1:{port}",
        "KILN_SCHEDULER_INTERVAL_S": "0.5",
        "KILN_HEARTBEAT_INTERVAL_S": "1",
        "PYTHONUNBUFFERED": "1",
        **extra_env,
    }
    kiln = Kiln(home=home, url=f"http://127.0.0.1:{port}", token=token, env=env)
    api = kiln.start(
        "api", "-m", "uvicorn", "api.app:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port)
    )
    try:
        wait_until_serving(f"{kiln.url}/healthz", api, timeout=30, log=home / "api.log")
        yield kiln
    finally:
        kiln.stop()


def signed_in_page(browser: Any, url: str, token: str) -> Any:
    """A desktop-sized page of the dashboard at ``url``, signed in with ``token``, its queue shown."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{url}/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#queue-list table")
    return page


@contextmanager
def chromium() -> Iterator[object]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
