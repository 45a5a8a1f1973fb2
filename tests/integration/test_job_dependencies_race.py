"""Two users change two queued jobs' dependencies at once, each to wait for the other: each change alone closes no
cycle, together they would keep both jobs waiting for good. On PostgreSQL, in separate transactions: without the
dependency lock, each transaction held its own job's row and waited for the other's (the new row's foreign key),
and PostgreSQL aborted one as a deadlock (a 500 for its user)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from sqlalchemy.orm import sessionmaker

from core.db import make_engine
from core.migrate import upgrade
from core.services import jobs as jobs_service
from core.services.errors import InvalidInput
from harness.services import temporary_database
from harness.workers_cluster import cluster_admin, submit

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 6


def test_two_changes_at_once_never_close_a_dependency_cycle() -> None:
    with temporary_database("kiln_dependency_race") as url:
        upgrade(url)
        engine = make_engine(url)
        maker = sessionmaker(bind=engine, expire_on_commit=False)
        spec = yaml.safe_load((ROOT / "examples" / "gpt-tiny.yaml").read_text())
        with maker() as db:
            principal = cluster_admin(db)
            db.commit()

        def change(job_id: int, waits_for: int, barrier: threading.Barrier, results: list[str]) -> None:
            with maker() as db:
                barrier.wait()
                try:
                    jobs_service.update(db=db, principal=principal, job_id=job_id, depends_on=[str(waits_for)])
                    db.commit()
                    results.append("changed")
                except InvalidInput as exc:
                    results.append("refused" if "would wait for itself" in str(exc) else str(exc))

        outcomes: list[list[str]] = []
        for _ in range(ROUNDS):
            with maker() as db:
                pair = (submit(db, spec).id, submit(db, spec).id)
                db.commit()
            barrier = threading.Barrier(2)
            results: list[str] = []
            threads = [threading.Thread(target=change, args=(a, b, barrier, results)) for a, b in (pair, pair[::-1])]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            outcomes.append(sorted(results))
        engine.dispose()
    assert outcomes == [["changed", "refused"]] * ROUNDS
