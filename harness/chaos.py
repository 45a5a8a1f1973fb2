"""The chaos harness: a whole kiln of real processes on a PostgreSQL and a Redis of its own, faults injected into
it, and the invariants checked afterwards from the database and the checkpoints on disk.

``bench/chaos_bench.py`` runs it with many jobs and every fault; ``tests/e2e/test_chaos_e2e.py`` with fewer, in
CI. Processes: the API (uvicorn), two schedulers (``python -m scheduler``: one leads through the advisory lock),
two workers (``python -m workers``) as two hosts, the trainer on CPU. Jobs go in through the API with an admin's
token; nothing but the faults (and, as a supervisor would, bringing a killed process back) touches the system:
no job is restarted or edited by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy import select, update

from core.db import session_scope
from core.fence import job_checkpoint_dir
from core.models import Attempt, Checkpoint, Event, Job, Team, TeamQuota
from core.services.bootstrap import bootstrap_admin
from core.states import TERMINAL, AttemptState, JobState
from harness.leader import leader_pid
from harness.private_servers import PrivatePostgres
from harness.read_only import read_only, shared_mount
from harness.redis_server import RedisServer
from harness.workers_cluster import Cluster, cluster, slow_steps, tiny_spec, wait_for


def chaos_spec(name: str, *, seed: int, steps: int, every_steps: int) -> dict[str, Any]:
    """The tiny GPT on CPU; every checkpoint kept on disk (the invariants read them all); restarts enough for a
    job to be hit by several faults."""
    spec = tiny_spec(name, steps=steps, every_steps=every_steps)
    spec["seed"] = seed
    spec["checkpointing"]["keep_last"] = 100  # the most a spec may keep
    spec["sla"] = {"qos": "silver", "max_restarts": 10}
    return spec


@dataclass
class FaultRecord:
    at_s: float  # when the fault struck, in seconds since the timeline began
    fault: str
    target: str
    detail: dict[str, Any] = field(default_factory=dict)


class Chaos:
    """The processes, their faults and the timeline. Use through :func:`chaos_cluster`."""

    def __init__(
        self,
        c: Cluster,
        pg: PrivatePostgres,
        redis: RedisServer,
        *,
        token: str,
        scheduler_interval_s: float,
        worker_slots: int,
        worker_hooks: dict[str, Any],
    ) -> None:
        self.c = c
        self.pg = pg
        self.redis = redis
        self.token = token
        self.scheduler_interval_s = scheduler_interval_s
        self.worker_slots = worker_slots
        self.worker_hooks = worker_hooks
        self.t0 = time.monotonic()
        self.timeline: list[FaultRecord] = []
        self._held: set[str] = set()  # processes down on purpose: the supervisor leaves them alone
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)

    # ------------------------------------------------------------------------------------------- processes

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def record(self, fault: str, target: str, *, at: float | None = None, **detail: Any) -> None:
        """A timeline entry: ``at`` when the fault struck (default now); ``done_s`` when it was over."""
        self.timeline.append(
            FaultRecord(self.elapsed() if at is None else at, fault, target, {**detail, "done_s": self.elapsed()})
        )

    def start_scheduler(self, label: str) -> None:
        self.c.start_scheduler(label, interval_s=self.scheduler_interval_s)

    def start_worker(self, label: str) -> str:
        return self.c.start_worker(label, cpu_slots=self.worker_slots, hooks=self.worker_hooks)

    def _restart(self, name: str) -> None:
        if name == "api":
            self.c.start_api()
        elif name in self.c.services:
            self.start_scheduler(name)
        else:
            self.start_worker(name.rsplit("-", 1)[0])

    def _supervise(self) -> None:
        """What systemd or compose's ``restart: unless-stopped`` do: a process that exits on its own (a worker
        that started while PostgreSQL was away exits at its registration) is started again."""
        while not self._stop.wait(1.0):
            with self._lock:
                procs = {**self.c.services, **self.c.workers}
                for name, proc in procs.items():
                    if name not in self._held and proc.poll() is not None:
                        self.record("exited by itself; restarted by its supervisor", name, exit_code=proc.returncode)
                        self._restart(name)

    def start_supervisor(self) -> None:
        self._supervisor.start()

    def stop_supervisor(self) -> None:
        self._stop.set()
        self._supervisor.join(timeout=150)

    @contextmanager
    def down(self, name: str, down_s: float) -> Iterator[None]:
        """Keep ``name`` down (the caller kills it) for ``down_s``, then start it again as its supervisor would."""
        with self._lock:
            self._held.add(name)
        try:
            yield
            time.sleep(down_s)
        finally:
            with self._lock:
                self._held.discard(name)
                self._restart(name)

    def schedulers(self) -> list[str]:
        return sorted(k for k in self.c.services if k.startswith("scheduler"))

    def leader(self) -> str | None:
        """The scheduler process holding the leader's lease, by its pid."""
        pid = leader_pid(self.c.env["KILN_DATABASE_URL"])
        return next((label for label in self.schedulers() if self.c.services[label].pid == pid), None)

    # ----------------------------------------------------------------------------------------------- jobs

    def submit(self, spec: dict[str, Any], *, timeout_s: float = 120) -> int:
        """Through the API as a user would, retrying while it is down (refused connection) or the database is
        away (503): neither can have committed the job."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                r = httpx.post(
                    f"{self.c.api_url}/v1/jobs",
                    json=spec,
                    timeout=30,
                    headers={"Authorization": f"Bearer {self.token}"},
                )
                if r.status_code == 201:
                    return int(r.json()["id"])
                if r.status_code != 503:
                    raise AssertionError(f"submit refused: {r.status_code} {r.text}")
            except httpx.ConnectError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("the API did not take the job in time")
            time.sleep(0.5)

    def jobs(self) -> list[Job]:
        with self.c.sessionmaker()() as db:
            return list(db.scalars(select(Job).order_by(Job.id)).all())

    def running_on(self, host: str) -> list[int]:
        """Jobs whose current attempt runs on ``host`` and has trained a step."""
        with self.c.sessionmaker()() as db:
            rows = db.execute(
                select(Job.id, Attempt.placement)
                .join(Attempt, Attempt.job_id == Job.id)
                .where(
                    Job.state == JobState.RUNNING,
                    Attempt.fencing_token == Job.fencing_token,
                    Attempt.state == AttemptState.RUNNING,
                    Attempt.first_step_at.is_not(None),
                )
            ).all()
        return [job_id for job_id, placement in rows if any(n.get("host") == host for n in placement or [])]

    def wait_final(self, job_ids: list[int], timeout_s: float) -> None:
        def done() -> bool:
            states = {j.id: j.state for j in self.jobs()}
            return all(states.get(j) in TERMINAL for j in job_ids)

        wait_for(done, timeout_s, f"jobs {job_ids} final", interval=1.0)

    # ---------------------------------------------------------------------------------------------- faults

    def _lost_after(self, since: float, *, silent_only: bool = False) -> list[int]:
        """Jobs with a LOST event since ``since`` (seconds of the harness); ``silent_only``: those declared LOST for
        silence (a lease expired, an attempt never started), not for a crash their worker reported."""
        cutoff = time.time() - (self.elapsed() - since)
        with self.c.sessionmaker()() as db:
            events = db.scalars(select(Event).where(Event.type == JobState.LOST)).all()
        silence = ("lease_expired", "never_started")
        return sorted(
            {
                e.job_id
                for e in events
                if e.job_id is not None
                and e.created_at.timestamp() >= cutoff
                and (not silent_only or (e.data or {}).get("incident") in silence)
            }
        )

    def wait_for_victims(self, host: str, timeout_s: float = 90) -> list[int]:
        return wait_for(lambda: self.running_on(host), timeout_s, f"a job training on {host}", interval=0.5)

    def sigstop_worker(self, host: str, *, for_s: float, whole_node: bool = False) -> None:
        """Freeze the worker (and with ``whole_node`` its trainers too) past its lease, then thaw it (worker
        first): its trainers must stop committing on their own, and the worker's heartbeat must fence them."""
        victims = self.wait_for_victims(host)
        worker = self.c.workers[host].pid
        trainers = self.c.trainer_pids(host) if whole_node else []
        since = self.elapsed()
        _signal([worker, *trainers], signal.SIGSTOP)
        try:
            time.sleep(for_s)
        finally:
            _signal([worker], signal.SIGCONT)
            time.sleep(1.0)
            _signal(trainers, signal.SIGCONT)
        self.record(
            "SIGSTOP worker" + (" and trainers" if whole_node else ""),
            host,
            jobs=victims,
            stopped_s=for_s,
            lost=self._lost_after(since),
            at=since,
        )

    def sigkill_worker(self, host: str, *, down_s: float, whole_node: bool = False) -> None:
        """SIGKILL the worker process (its trainers get SIGTERM from the parent-death signal), or with
        ``whole_node`` the worker and every trainer under it (a host lost); it comes back after ``down_s``
        (past the lease: the reconciler, not the restarted worker, declares the loss)."""
        victims = self.wait_for_victims(host)
        since = self.elapsed()
        with self.down(host, down_s):
            if whole_node:
                killed = self.c.kill_worker(host)
            else:
                proc = self.c.workers[host]
                proc.kill()  # Popen's: never a signal to a pid it has already reaped
                proc.wait(10)
                killed = [proc.pid]
        self.record(
            "SIGKILL worker" + (" and trainers" if whole_node else ""),
            host,
            jobs=victims,
            pids=killed,
            down_s=down_s,
            lost=self._lost_after(since),
            at=since,
        )

    def sigkill_trainer(self, *hosts: str) -> None:
        """SIGKILL one training process on the first of ``hosts`` with a job training: its worker reports the crash,
        the job restarts. Several hosts, because after an earlier fault the jobs still running may all have been
        placed elsewhere (a CI run waited 90 s on b while the requeued jobs trained on a)."""

        def training() -> tuple[str, list[int], int] | None:
            # A rank alive under the host's worker too: a job the database still shows training may have just
            # trained its last step (a CI run found the job RUNNING on b and no rank left under b's worker).
            for h in hosts:
                jobs = self.running_on(h)
                rank = next((p for p in self.c.trainer_pids(h) if _is_rank(p)), None) if jobs else None
                if rank is not None:
                    return h, jobs, rank
            return None

        host, victims, target = wait_for(training, 90, f"a job training on {' or '.join(hosts)}", interval=0.5)
        since = self.elapsed()
        os.kill(target, signal.SIGKILL)
        wait_for(lambda: self._lost_after(since), 60, "the killed trainer's job LOST")
        self.record("SIGKILL trainer", host, jobs=victims, pid=target, lost=self._lost_after(since), at=since)

    def sigkill_leader(self, *, down_s: float) -> None:
        leader = wait_for(self.leader, 60, "a leading scheduler")
        others = [s for s in self.schedulers() if s != leader]
        since = self.elapsed()
        with self.down(leader, down_s):
            os.kill(self.c.services[leader].pid, signal.SIGKILL)
            self.c.services[leader].wait(10)
            new = wait_for(lambda: (lead := self.leader()) in others and lead, 60, "a standby taking the lead")
        self.record("SIGKILL leader scheduler", leader, new_leader=new, down_s=down_s, at=since)

    def sigstop_leader(self, *, for_s: float, submit: Callable[[], int]) -> None:
        """Freeze the leading scheduler (SIGSTOP) for ``for_s``, past its lease, and ``submit`` a job at once: a
        standby must take the lease and admit it (the cluster has room: call this while it is idle); thawed, the
        old leader must step down by itself."""
        leader = wait_for(self.leader, 60, "a leading scheduler")
        proc = self.c.services[leader]
        since = self.elapsed()
        proc.send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            job = submit()
            wait_for(lambda: self._admitted(job), for_s, f"job {job} admitted while the leader is frozen", interval=0.1)
            admitted_s = time.monotonic() - t0
            new = self.leader()
            time.sleep(max(0.0, for_s - (time.monotonic() - t0)))
        finally:
            proc.send_signal(signal.SIGCONT)
        stepped_down = wait_for(lambda: "stepping down" in self.c.log_text(leader), 30, f"{leader} stepping down")
        self.record(
            "SIGSTOP leader scheduler past its lease",
            leader,
            new_leader=new,
            frozen_s=for_s,
            job=job,
            admitted_s=round(admitted_s, 2),
            old_leader_stepped_down=stepped_down,
            at=since,
        )

    def _admitted(self, job_id: int) -> bool:
        with self.c.sessionmaker()() as db:
            return db.scalars(select(Attempt.id).where(Attempt.job_id == job_id)).first() is not None

    def read_only_across_last_step(self, *, for_s: float, steps: int, every_steps: int) -> None:
        """The checkpoint directory of a job about to take its last step read-only (a read-only bind mount, which
        reaches its sandbox through the shared storage mount) for ``for_s``: its final save fails meanwhile. It
        must never read SUCCEEDED on a final checkpoint that is not on disk."""

        def near_the_end() -> int | None:
            with self.c.sessionmaker()() as db:
                rows = db.execute(select(Job.id, Job.last_step).where(Job.state == JobState.RUNNING)).all()
            close = [(step, j) for j, step in rows if step is not None and steps - 2 * every_steps <= step < steps]
            return max(close)[1] if close else None

        job = wait_for(near_the_end, 180, "a job near its last step", interval=0.2)
        since = self.elapsed()
        with read_only(job_checkpoint_dir(Path(self.c.env["KILN_STORAGE_DIR"]), job)):
            time.sleep(for_s)
        with self.c.sessionmaker()() as db:
            row = db.get(Job, job)
            state = row.state if row else None
        self.record(
            "checkpoint storage read-only across the last step",
            "storage",
            jobs=[job],
            read_only_s=for_s,
            state_after=state,
            lost=self._lost_after(since),
            at=since,
        )

    def postgres_outage_with_leader_change(self, *, down_s: float, lease_s: float) -> None:
        """PostgreSQL stopped for ``down_s`` (past the attempts' leases) while the leading scheduler dies, so that a
        standby leads when it comes back; no attempt may be declared LOST for silence that fell in the outage. The
        LOST count is taken one lease (and a little) after the database came back."""
        leader = wait_for(self.leader, 60, "a leading scheduler")
        training = self.running_on(self.c.host("a")) + self.running_on(self.c.host("b"))
        since = self.elapsed()
        self.pg.stop_immediate()
        with self.down(leader, 0.0):
            proc = self.c.services[leader]
            proc.kill()
            proc.wait(10)
            time.sleep(down_s)
            self.pg.start()
            back = self.elapsed()
            new = wait_for(lambda: (lead := self.leader()) not in (None, leader) and lead, 60, "a new leader")
        time.sleep(lease_s + 3.0)
        lost = self._lost_after(since, silent_only=True)
        self.record(
            "PostgreSQL outage ending with a leader change",
            "postgres",
            down_s=down_s,
            old_leader=leader,
            new_leader=new,
            back_at_s=back,
            training=training,
            lost=lost,
            at=since,
        )

    def sigkill_api(self, *, down_s: float) -> None:
        since = self.elapsed()
        with self.down("api", down_s):
            proc = self.c.services["api"]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self.record("SIGKILL API", "api", down_s=down_s, at=since)

    def sigkill_redis(self, *, down_s: float) -> None:
        self._server_outage("SIGKILL Redis", "redis", self.redis.kill, self.redis.start, down_s)

    def postgres_immediate_stop(self, *, down_s: float) -> None:
        self._server_outage("PostgreSQL stop -m immediate", "postgres", self.pg.stop_immediate, self.pg.start, down_s)

    def _server_outage(
        self, fault: str, server: str, stop: Callable[[], object], start: Callable[[], object], down_s: float
    ) -> None:
        """``stop`` a server, leave it down ``down_s`` seconds, ``start`` it again; recorded as ``fault``."""
        since = self.elapsed()
        stop()
        time.sleep(down_s)
        start()
        self.record(fault, server, down_s=down_s, lost=self._lost_after(since, silent_only=True), at=since)

    def consumer_died(self, host: str) -> bool:
        """Whether a worker process of ``host`` lost its Celery consumer in kombu's ``restore_unacked_once`` after
        a Redis crash (issue 12 item 2): it then heartbeats but consumes nothing."""
        return "restore_unacked_once" in self.c.log_text(host)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _is_rank(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return "rank.entry" in " ".join(psutil.Process(pid).cmdline())
    return False


@contextmanager
def chaos_cluster(
    tmp: Path,
    *,
    lease_s: float,
    heartbeat_s: float = 1.0,
    scheduler_interval_s: float = 1.0,
    worker_slots: int = 3,
    step_sleep_s: float = 0.15,
    leader_lease_s: float = 3.0,
    final_checkpoint_retry_s: float = 3.0,
) -> Iterator[Chaos]:
    """PostgreSQL and Redis of its own, migrated and bootstrapped (an admin, the ``default`` team with CPU slots
    for both hosts); the API, two schedulers and two workers running. The storage directory is a shared mount, so
    that a read-only mount made under it later reaches the sandboxes (as a remount of real storage would)."""
    with ExitStack() as stack:
        storage = tmp / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        stack.enter_context(shared_mount(storage))
        pg = PrivatePostgres().init()
        stack.callback(pg.remove)
        pg.start()
        redis = RedisServer(tmp / "redis")
        stack.callback(redis.stop)
        redis.start()
        url = pg.create_database("kiln")
        env = {
            "KILN_LEADER_LEASE_S": str(leader_lease_s),
            "KILN_FINAL_CHECKPOINT_RETRY_S": str(final_checkpoint_retry_s),
        }
        c = stack.enter_context(
            cluster(
                tmp, database_url=url, broker_url=redis.url(), lease_s=lease_s, heartbeat_s=heartbeat_s, extra_env=env
            )
        )
        with session_scope() as db:
            _user, token = bootstrap_admin(db=db, name="admin")
            team = db.scalars(select(Team).where(Team.name == "default")).one()
            db.execute(
                update(TeamQuota)
                .where(TeamQuota.team_id == team.id, TeamQuota.gpu_type == "cpu")
                .values(nominal=2 * worker_slots)
            )
        chaos = Chaos(
            c,
            pg,
            redis,
            token=token,
            scheduler_interval_s=scheduler_interval_s,
            worker_slots=worker_slots,
            worker_hooks=slow_steps(step_sleep_s),
        )
        c.start_api()
        chaos.start_scheduler("scheduler-1")
        chaos.start_scheduler("scheduler-2")
        for label in ("a", "b"):
            chaos.start_worker(label)
        chaos.start_supervisor()
        stack.callback(chaos.stop_supervisor)  # before the cluster stops its processes (callbacks run last-in first)
        yield chaos


# ------------------------------------------------------------------------------------------------- invariants


@dataclass
class Verdict:
    name: str
    ok: bool
    failures: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "failures": self.failures}


def _manifests(storage: Path, job_id: int) -> dict[int, tuple[dict[str, Any], Path]]:
    root = job_checkpoint_dir(storage, job_id)
    out = {}
    for p in root.glob("step_*"):
        with contextlib.suppress(OSError, ValueError):
            out[int(p.name[5:])] = (json.loads((p / "manifest.json").read_text()), p)
    return out


def _telemetry_checkpoints(storage: Path, job_id: int, attempt: int) -> list[dict[str, Any]]:
    out = []
    for path in (storage / "runs" / str(job_id)).glob(f"{attempt}*/telemetry/rank*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rec = json.loads(line)
                if rec.get("kind") == "checkpoint":
                    out.append(rec)
    return out


def check_invariants(
    chaos: Chaos, job_ids: list[int], twin_of: dict[int, int], verify: Callable[[Path], str | None] | None = None
) -> list[Verdict]:
    """The acceptance's invariants, from the database and the checkpoints on disk. ``twin_of``: job -> its
    fault-free twin. ``verify``: a checkpoint's integrity check (``trainer.checkpoint.store.verify``)."""
    storage = chaos.c.env["KILN_STORAGE_DIR"]
    storage_dir = Path(storage)
    with chaos.c.sessionmaker()() as db:
        jobs = {j.id: j for j in db.scalars(select(Job).where(Job.id.in_(job_ids + list(twin_of.values()))))}
        attempts = {
            j: list(db.scalars(select(Attempt).where(Attempt.job_id == j).order_by(Attempt.number))) for j in jobs
        }
        rows = {j: list(db.scalars(select(Checkpoint).where(Checkpoint.job_id == j))) for j in jobs}

    final = Verdict("every job SUCCEEDED, with no manual restart", True)
    fenced = Verdict("no checkpoint committed by an attempt after it was declared LOST", True)
    result = Verdict("each job's recorded step, loss and checkpoint list are its last checkpoint's", True)
    twins = Verdict("final loss equals the fault-free twin's", True)
    for j in job_ids + sorted(set(twin_of.values())):
        job = jobs[j]
        if job.state != JobState.SUCCEEDED:
            final.failures.append(f"job {j} ended {job.state}: {job.exit_reason}")
        spec_steps = int(job.spec["steps"])
        manifests = _manifests(storage_dir, j)
        by_token = {a.fencing_token: a for a in attempts[j]}
        # 2. Nothing after LOST: on disk (manifests), in the database (checkpoint rows), in the telemetry.
        for a in attempts[j]:
            if a.state != AttemptState.LOST or a.ended_at is None:
                continue
            lost_at = a.ended_at.timestamp()
            for step, (m, _p) in manifests.items():
                if m.get("fencing_token") == a.fencing_token and m["created"] >= lost_at:
                    fenced.failures.append(
                        f"job {j} step {step}: committed by attempt {a.number} "
                        f"{m['created'] - lost_at:.2f} s after it was LOST"
                    )
            for row in rows[j]:
                if row.attempt_id == a.id and row.created_at.timestamp() >= lost_at:
                    fenced.failures.append(f"job {j}: checkpoint row of step {row.step} by LOST attempt {a.number}")
            for rec in _telemetry_checkpoints(storage_dir, j, a.number):
                if rec.get("ts", 0) >= lost_at:
                    fenced.failures.append(
                        f"job {j}: attempt {a.number} reported a checkpoint at step {rec.get('step')} after it was LOST"
                    )
        for step, (m, _p) in manifests.items():
            owner = by_token.get(int(m.get("fencing_token") or -1))
            if owner is None:
                fenced.failures.append(f"job {j} step {step}: token {m.get('fencing_token')} is no attempt's")
        # 3. The recorded result is the last checkpoint's.
        if not manifests:
            result.failures.append(f"job {j}: no checkpoint on disk")
            continue
        last_step = max(manifests)
        last, last_path = manifests[last_step]
        if (job.last_step, last_step) != (spec_steps, spec_steps):
            result.failures.append(
                f"job {j}: recorded step {job.last_step}, last checkpoint {last_step}, spec {spec_steps}"
            )
        if job.last_loss is None or last.get("loss") is None or abs(job.last_loss - last["loss"]) > 1e-9:
            result.failures.append(f"job {j}: recorded loss {job.last_loss}, last checkpoint's {last.get('loss')}")
        if verify is not None and (why := verify(last_path)) is not None:
            result.failures.append(f"job {j}: the last checkpoint does not verify: {why}")
        for row in rows[j]:
            entry = manifests.get(row.step)
            if entry is None:
                result.failures.append(f"job {j}: checkpoint row of step {row.step} has nothing on disk")
                continue
            digest = hashlib.sha256((entry[1] / "manifest.json").read_bytes()).hexdigest()
            if row.sha256 != digest:
                result.failures.append(f"job {j}: checkpoint row of step {row.step} does not match its manifest")
        final_attempt = attempts[j][-1] if attempts[j] else None
        since = (final_attempt.resumed_from_step or 0) if final_attempt else 0
        missing = sorted({s for s in manifests if s >= since} - {r.step for r in rows[j]})
        if missing:
            result.failures.append(f"job {j}: checkpoints on disk since the resume not listed: {missing}")
        # 4. The twin's loss.
        twin = twin_of.get(j)
        if twin is not None:
            ref = jobs[twin].last_loss
            if job.last_loss is None or ref is None or abs(job.last_loss - ref) > 1e-6 * max(1.0, abs(ref)):
                twins.failures.append(f"job {j}: final loss {job.last_loss}, twin {twin}'s {ref}")
    out = [final, fenced, result, twins]
    for v in out:
        v.ok = not v.failures
    return out


def timeline_verdicts(chaos: Chaos, leader_lease_s: float) -> list[Verdict]:
    """The faults' own invariants: no attempt declared LOST for silence inside a database outage; a job submitted
    while the leader was frozen admitted by a standby within the leader's lease + 2 s, the old leader stepping down;
    the job whose storage was read-only across its last step never SUCCEEDED while it was (its final state is
    checked with the others')."""
    outage = Verdict("0 attempts lost because of a database outage", True)
    frozen = Verdict(f"a standby admits within the leader's lease + 2 s ({leader_lease_s + 2:.0f} s)", True)
    for f in chaos.timeline:
        if f.target == "postgres" and f.detail.get("lost"):
            outage.failures.append(f"{f.fault} at {f.at_s} s: jobs {f.detail['lost']} LOST for silence")
        if f.fault.startswith("SIGSTOP leader"):
            if not f.detail.get("admitted_s") or f.detail["admitted_s"] > leader_lease_s + 2:
                frozen.failures.append(f"admitted after {f.detail.get('admitted_s')} s")
            if not f.detail.get("old_leader_stepped_down"):
                frozen.failures.append(f"{f.target} did not step down")
    for v in (outage, frozen):
        v.ok = not v.failures
    return [outage, frozen]


def job_summaries(chaos: Chaos, job_ids: list[int]) -> list[dict[str, Any]]:
    """Per job: its final state, step, loss, restarts and each attempt's host and end."""
    out = []
    with chaos.c.sessionmaker()() as db:
        for j in job_ids:
            job = db.get(Job, j)
            assert job is not None
            attempts = db.scalars(select(Attempt).where(Attempt.job_id == j).order_by(Attempt.number)).all()
            out.append(
                {
                    "id": j,
                    "name": job.name,
                    "seed": job.spec.get("seed"),
                    "state": job.state,
                    "last_step": job.last_step,
                    "last_loss": job.last_loss,
                    "restarts": job.restart_count,
                    "attempts": [
                        {
                            "number": a.number,
                            "host": (a.placement or [{}])[0].get("host"),
                            "state": a.state,
                            "resumed_from_step": a.resumed_from_step,
                            "exit_reason": a.exit_reason,
                        }
                        for a in attempts
                    ],
                }
            )
    return out
