"""Checkpoint exports on a worker: a thread that claims the oldest export request (core/services/exports.py) and
converts it with ``python -m trainer.export`` in a child process (torch and memory stay out of the worker, as for
training), then records the result. One export at a time per worker; every worker of the cluster takes part, so
an export needs no particular host, only the shared storage the checkpoints are on.

A checkpoint is the team's own data, written by its code: the conversion runs in the team's sandbox, as the team's
uid (``workers.sandbox``), reading the checkpoint read-only and writing into a staging directory of that uid's. The
worker then moves the two files it expects, each checked to be a regular file, into the export's own directory,
which is kiln's: what the API serves can no longer be changed or swapped for a link by anything of the team's."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from core.checkpoint_files import sha256_file
from core.db import session_scope, utcnow
from core.deployment import deployment_uid
from core.models import Job
from core.private import private_dir
from core.services import exports
from workers.isolation import Isolation
from workers.sandbox import View

log = logging.getLogger(__name__)

POLL_S = 2.0
TIMEOUT_S = 3600.0


class ExportRunner:
    def __init__(
        self,
        *,
        worker: str,
        storage_dir: Path,
        poll_s: float = POLL_S,
        sessions: Callable[[], AbstractContextManager[Session]] = session_scope,
        isolation: Isolation | None = None,
        storage_gid: int | None = None,
    ) -> None:
        """``sessions``: a unit of work per use (commits on exit); tests pass their own. ``isolation``: the worker's
        (its sandbox, its teams' uids); None converts unsandboxed. ``storage_gid``: the group that may read the
        result (the API's, where it runs as another user)."""
        self.sessions = sessions
        self.isolation = isolation
        self.storage_gid = storage_gid
        self.worker = worker
        self.storage_dir = storage_dir
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> bool:
        """Claim and convert one export; False when none was waiting."""
        with self.sessions() as db:
            claimed = exports.claim_next(db, worker=self.worker, now=utcnow())
            if claimed is None:
                return False
            export, checkpoint = claimed
            export_id, job_id, step, source = export.id, export.job_id, export.step, Path(checkpoint.path)
            job = db.get(Job, job_id)
            team_id, deployment = (job.team_id if job else 0), deployment_uid(db)
        out = exports.export_dir(self.storage_dir, job_id, step)
        log.info("exporting job %s step %s from %s", job_id, step, source)
        try:
            error, manifest = self._convert(source, out, job_id, team_id=team_id, deployment=deployment)
            if error is None and manifest is not None:
                error = sealed(out, manifest)
        except OSError as exc:  # the export's storage (read-only, full, gone): the export fails, it is not retried
            error, manifest = f"the export could not be written: {exc}", None
        with self.sessions() as db:
            exports.finish(
                db,
                export_id,
                now=utcnow(),
                error=error,
                size=int(manifest["bytes"]) if manifest else None,
                sha256=str(manifest["sha256"]) if manifest else None,
            )
        return True

    def _convert(
        self, source: Path, out: Path, job_id: int, *, team_id: int, deployment: str
    ) -> tuple[str | None, dict[str, Any] | None]:
        sandbox = self.isolation.sandbox if self.isolation is not None else None
        if sandbox is None:
            return _run([sys.executable, "-m", "trainer.export", str(source), str(out), "--job", str(job_id)])
        assert self.isolation is not None
        user = self.isolation.users.for_team(team_id, deployment) if sandbox.as_root else None
        staging = out.parent / f".{out.name}.{secrets.token_hex(6)}"
        staging.mkdir(parents=True)
        try:
            if user is not None:
                user.take(staging, stop=self.storage_dir)
            argv = [sys.executable, "-m", "trainer.export", str(source), str(staging), "--job", str(job_id)]
            launch = sandbox.command(argv, View(writable=(staging,), read_only=(source,), cwd=staging), user=user)
            try:
                error, manifest = _run(launch.argv, pass_fds=launch.fds)
            finally:
                launch.close()
            if error is None:
                error = self._publish(staging, out)
            return error, manifest if error is None else None
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _publish(self, staging: Path, out: Path) -> str | None:
        """Move the export's files from the team's staging directory into kiln's own, each a regular file."""
        private_dir(out, gid=self.storage_gid)
        for name in exports.FILES:
            try:
                os.rename(staging / name, out / name)
            except OSError as exc:
                return f"the conversion left no {name}: {exc.strerror}"
            # Checked once in kiln's own directory, where nothing of the team's can swap it any more; never followed.
            try:
                fd = os.open(out / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:  # a link (ELOOP), or something that cannot be opened as a file
                os.unlink(out / name)
                return f"the conversion's {name} is not a regular file"
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.unlink(out / name)
                    return f"the conversion's {name} is not a regular file"
                os.fchown(fd, 0 if os.geteuid() == 0 else -1, self.storage_gid if self.storage_gid else -1)
                os.fchmod(fd, 0o640 if self.storage_gid is not None else 0o600)
            finally:
                os.close(fd)
        return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.run_once()
            except Exception:
                log.exception("export runner iteration failed")
                busy = False
            if not busy:
                self._stop.wait(self.poll_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="checkpoint-exports", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def sealed(out: Path, manifest: dict[str, Any]) -> str | None:
    """The export as the API will serve it, made durable and checked: each file and then the directory (its renames)
    fsynced, and the weights read back against the size and sha256 the conversion reported. An export is ``ready``
    only past this; None when it is sound, else why it is not."""
    try:
        for name in exports.FILES:
            _fsync(out / name, os.O_RDONLY | os.O_NOFOLLOW)
        _fsync(out, os.O_RDONLY | os.O_DIRECTORY)
        weights = out / exports.FILES[0]
        size, digest = weights.stat().st_size, sha256_file(weights)
    except OSError as exc:
        return f"the export could not be made durable: {exc}"
    if (size, digest) != (manifest.get("bytes"), manifest.get("sha256")):
        return f"the exported weights read back do not match the conversion's ({size} bytes, sha256 {digest[:12]})"
    return None


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _run(argv: list[str], pass_fds: list[int] | None = None) -> tuple[str | None, dict[str, Any] | None]:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "HOME": "/tmp"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, pass_fds=pass_fds or ())
    except subprocess.TimeoutExpired:
        return f"the conversion took over {TIMEOUT_S:.0f} s", None
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1], None
    return None, json.loads(done.stdout.strip().splitlines()[-1])
