"""Checkpoint exports on a worker: a thread that claims the oldest export request (core/services/exports.py) and
converts it with ``python -m trainer.export`` in a child process (torch and memory stay out of the worker, as for
training), then records the result. One export at a time per worker; every worker of the cluster takes part, so
an export needs no particular host, only the shared storage the checkpoints are on."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from core.db import session_scope, utcnow
from core.services import exports

log = logging.getLogger(__name__)

POLL_S = 2.0
TIMEOUT_S = 3600.0


class ExportRunner:
    def __init__(self, *, worker: str, storage_dir: Path, poll_s: float = POLL_S,
                 sessions: Callable[[], AbstractContextManager[Session]] = session_scope) -> None:  # fmt: skip
        """``sessions``: a unit of work per use (commits on exit); tests pass their own."""
        self.sessions = sessions
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
        out = exports.export_dir(self.storage_dir, job_id, step)
        log.info("exporting job %s step %s from %s", job_id, step, source)
        error, manifest = self._convert(source, out, job_id)
        with self.sessions() as db:
            exports.finish(db, export_id, now=utcnow(), error=error,
                           size=int(manifest["bytes"]) if manifest else None,
                           sha256=str(manifest["sha256"]) if manifest else None)  # fmt: skip
        return True

    def _convert(self, source: Path, out: Path, job_id: int) -> tuple[str | None, dict[str, Any] | None]:
        argv = [sys.executable, "-m", "trainer.export", str(source), str(out), "--job", str(job_id)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"the conversion took over {TIMEOUT_S:.0f} s", None
        if done.returncode != 0:
            return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1], None
        return None, json.loads(done.stdout.strip().splitlines()[-1])

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
