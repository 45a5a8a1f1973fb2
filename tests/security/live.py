"""A real API process (uvicorn on a SQLite file, no scheduler or worker) with one QUEUED job that has an attempt
and a log file, shared by the security tests that need the API as clients see it (``live`` in conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy.orm import Session

from core.db import make_engine
from core.models import Attempt
from harness.dashboard import Kiln, running_kiln


@dataclass
class Live:
    kiln: Kiln
    job: int
    log: Path  # the job's attempt log, as a worker writes it

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.kiln.token}"}

    def user_token(self, name: str) -> str:
        """A member of the default team, with a token of their own."""
        with self.kiln.api() as api:
            assert api.post("/v1/users", json={"name": name}).status_code == 201
            assert api.put(f"/v1/teams/default/members/{name}", json={"role": "member"}).status_code == 201
            r = api.post("/v1/tokens", json={"name": "mine", "user": name, "scopes": ["read", "write"]})
            return str(r.json()["secret"])

    def ticket(self, path: str, token: str | None = None) -> str:
        r = httpx.post(f"{self.kiln.url}/v1/stream-tickets", json={"path": path}, headers=self.headers(token))
        assert r.status_code == 201, r.text
        return str(r.json()["ticket"])


@contextmanager
def live_api(home: Path) -> Iterator[Live]:
    """Streams keep alive and re-check every half second here (15 s and 5 s by default), for quick tests."""
    with running_kiln(home, KILN_SSE_KEEPALIVE_S="0.5", KILN_SSE_RECHECK_S="0.5") as kiln:
        example = (Path(__file__).resolve().parents[2] / "examples" / "gpt-tiny.yaml").read_text()
        with kiln.api() as api:
            r = api.post("/v1/jobs", content=example, headers={"Content-Type": "application/yaml"})
            assert r.status_code == 201, r.text
        job = int(r.json()["id"])
        engine = make_engine(kiln.env["KILN_DATABASE_URL"])
        with Session(engine) as db:  # the job stays QUEUED (no scheduler) with an attempt to stream
            db.add(Attempt(job_id=job, number=1, fencing_token=1, placement=[{"host": "h1", "slots": 1}]))
            db.commit()
        engine.dispose()
        log = home / "storage" / "logs" / str(job) / "1.log"
        log.parent.mkdir(parents=True)
        log.write_text("".join(f"line {i}\n" for i in range(1, 4)))
        yield Live(kiln, job, log)
