"""Docs that cannot rot: the README's "A first session" and every transcript of docs/cli.md, run word for word on the
embedded default (``./kiln up`` on a fresh KILN_HOME, the CPU worker) and compared with what the docs show by shape
(:mod:`tests.e2e.transcripts`): an edit to the docs is what gets tested, and output that drifts from them fails.

One ``kiln up`` serves the README and the transcripts after it until one asks for a fresh one
(``<!-- transcript: fresh -->``); the README's ``./kiln up`` is that kiln up, and its Ctrl-C is compared when it
stops. Files the transcripts name (``bad.yaml``, ``wide.yaml`` ...) are in ``tests/e2e/transcript_files``."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.services import free_port
from tests.e2e.transcripts import Block, Command, blocks, disagreement

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
FILES = Path(__file__).with_name("transcript_files")
DOCS_HOME = "/tmp/kiln-demo"  # where the docs' transcripts ran: its paths in commands become the test's own
BANNER_END = "Ctrl-C stops everything"


class Session:
    """A working directory like the docs' (``./kiln``, ``examples/``, the files the transcripts name) and at most one
    foreground ``kiln up`` in it."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        self.up: subprocess.Popen[str] | None = None
        self.detached = False
        self.banner: list[str] = []
        self.on_interrupt: list[tuple[str, Command]] = []
        self.problems: list[str] = []
        self.readme_problems: list[str] | None = None
        self.last_exit = 0
        self.fresh()

    def fresh(self) -> None:
        """A new directory and KILN_HOME (a kiln up of its own starts at the next ``./kiln up`` or command)."""
        self.stop()
        # As long as the docs' /tmp/kiln-demo, so that tables wrap their paths as there.
        self.cwd = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
        self.dirs.append(self.cwd)
        (self.cwd / "kiln").write_text(f'#!/bin/sh\nexec {shlex.quote(str(ROOT / "kiln"))} "$@"\n')
        (self.cwd / "kiln").chmod(0o755)
        (self.cwd / "examples").symlink_to(ROOT / "examples")
        for file in FILES.iterdir():
            shutil.copy(file, self.cwd / file.name)
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        self.env |= {
            "KILN_HOME": str(self.cwd / ".kiln"),
            "XDG_CONFIG_HOME": str(self.cwd / "xdg"),
            "KILN_SCHEDULER_METRICS_PORT": str(free_port()),
            "KILN_WORKER_METRICS_PORT": str(free_port()),
            "COLUMNS": "120",
            "PYTHONUNBUFFERED": "1",
        }

    def here(self, command: str) -> str:
        """The docs' paths made this session's, and ``kiln up`` on a free port (the docs' 8421 may be taken)."""
        command = command.replace(DOCS_HOME, str(self.cwd))
        return re.sub(r"^\./kiln up\b", f"./kiln up --port {self.port}", command)

    def start_up(self, command: str) -> list[str]:
        """``./kiln up`` in the foreground; its banner once ready (the bootstrap's lines left out: .venv exists)."""
        if self.up is not None:
            return self.banner
        out = (self.cwd / "up.out").open("w")
        argv = shlex.split(self.here(command))
        self.up = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 180
        while BANNER_END not in (text := (self.cwd / "up.out").read_text()):
            if self.up.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"kiln up did not come up:\n{text[-3000:]}")
            time.sleep(0.3)
        self.banner = text.splitlines()
        self.wait_ready()
        return [line for line in self.banner if not line.startswith("kiln: ")]

    def wait_ready(self) -> None:
        url = next(line.split("API ")[1].split("/v1")[0] for line in self.banner if "kiln is up" in line)
        for _ in range(120):
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)

    def stop(self) -> None:
        """Ctrl-C, as the docs' transcripts press it; what it printed then is compared with theirs."""
        if self.detached:  # a transcript's `kiln up --detach` that its own `kiln down` did not stop
            self.shell("./kiln down --timeout 30")
            self.detached = False
        if self.up is None:
            return
        self.up.send_signal(signal.SIGINT)
        try:
            self.up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.up.kill()
            self.problems.append("kiln up did not stop within 90 s of Ctrl-C")
        printed = (self.cwd / "up.out").read_text().splitlines()[len(self.banner) :]
        for source, command in self.on_interrupt:
            self.check(source, f"{command.line} (Ctrl-C)", command.after_interrupt, printed)
        self.up, self.banner, self.on_interrupt = None, [], []

    def shell(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """One command line as bash runs it, ``$?`` that of the command before (the docs' ``echo $?``); one that
        outlasts ``timeout`` is killed with what it started, and exits 124 as under timeout(1)."""
        line = f"(exit {self.last_exit}); {self.here(command)}"
        proc = subprocess.Popen(
            ["bash", "-c", line],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate()[0] + f"\n(killed after {timeout:.0f} s)"
            proc.returncode = 124
        self.last_exit = proc.returncode
        return subprocess.CompletedProcess(line, proc.returncode, out)

    def check(self, source: str, command: str, shown: list[str], printed: list[str]) -> None:
        if problem := disagreement(source, command, shown, printed, socket.gethostname()):
            print(f"\n{problem}")
            self.problems.append(problem)

    def run(self, block: Block) -> None:
        if block.fresh:
            self.fresh()
        for setup in block.before:
            if setup.startswith("./kiln up"):
                self.start_up(setup)
                continue
            self.ensure_up(setup)
            done = self.shell(setup)
            assert done.returncode == 0, f"{block.source}: before `{setup}`: {done.stdout[-2000:]}"
        for command in block.commands:
            self.run_command(block.source, command)

    def ensure_up(self, command: str) -> None:
        """A CLI command finds kiln up running, as after the README's set-up (but `kiln up` and `kiln down`)."""
        if self.up is None and command.startswith("./kiln") and not command.startswith(("./kiln up", "./kiln down")):
            self.start_up("./kiln up")

    def run_command(self, source: str, command: Command) -> None:
        if command.line.split("#")[0].split() == ["./kiln", "up"]:
            printed = self.start_up("./kiln up")
            shown = [line for line in command.shown if not line.startswith("kiln: ")]  # .venv exists already
            self.check(source, command.line, shown, printed)
            if command.after_interrupt:
                self.on_interrupt.append((source, command))
            return
        self.ensure_up(command.line)
        self.detached |= command.line.startswith("./kiln up --detach")
        done = self.shell(command.line)
        self.check(source, command.line, command.shown, done.stdout.splitlines())
        if command.exit_code is not None and done.returncode != command.exit_code:
            self.problems.append(
                f"{source}: `$ {command.line}` exited {done.returncode}, the docs say {command.exit_code}"
            )


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    started = time.monotonic()
    shared = Session()
    try:
        yield shared
    finally:
        shared.stop()
        for made in shared.dirs:
            shutil.rmtree(made, ignore_errors=True)
        print(f"\ndoc transcripts: {time.monotonic() - started:.0f} s in all")


def run_all(session: Session, found: list[Block]) -> list[str]:
    session.problems = []
    for block in found:
        if block.skip is None:
            session.run(block)
    return session.problems


def readme_session(session: Session) -> list[str]:
    """The README's first session, once per module: docs/cli.md's transcripts go on from its job 1."""
    if session.readme_problems is None:
        found = blocks(ROOT / "README.md", ROOT, "## A first session")
        assert [c.line for b in found for c in b.commands][:3] == [
            "./kiln up",
            "./kiln submit examples/gpt-tiny.yaml --follow",
            "./kiln ls",
        ]
        session.readme_problems = list(run_all(session, found))
    return session.readme_problems


def test_the_readmes_first_session_prints_what_the_readme_shows(session: Session) -> None:
    problems = readme_session(session)
    assert not problems, "\n\n".join(problems)


def test_every_transcript_of_the_cli_docs_prints_what_they_show(session: Session) -> None:
    """After the README's session, on the same kiln up (the README's job 1 is docs/cli.md's first job)."""
    readme_session(session)
    found = blocks(ROOT / "docs" / "cli.md", ROOT)
    assert len(found) > 20
    run_all(session, found)
    session.stop()  # the Ctrl-C of docs/cli.md's `kiln up`
    assert not session.problems, "\n\n".join(session.problems)
