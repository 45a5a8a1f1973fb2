"""docker-compose.yml's commands run for real, without Docker: Redis started by the compose file's own command with
its password from a secret file, the GPU worker's command against it (healthy, then frozen, then back), and the
scheduler's healthcheck for a leader, a standby and a leader whose cycles fail.

Paths the containers see (/run/secrets, /tmp) are mapped into the test's directory; nothing else is changed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from sqlalchemy import select

from core.db import make_engine
from core.liveness import check
from core.migrate import upgrade
from core.models import Host
from core.settings import Settings
from harness.services import free_port, temporary_database
from harness.workers_cluster import wait_for
from tests.support.scheduler_loop import LoopThread
from workers.dispatch import dispatch_attempt

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERVICES: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
PASSWORD = "0b5c1d2e3f4a5b6c7d8e9f00112233445566778899aabbccddeeff0011223344"  # as `openssl rand -hex 32`


def unescape(text: str, tmp: Path) -> str:
    """What the container's shell gets from compose ($$ -> $), with the containers' paths mapped under ``tmp``."""
    mapped = {"/run/secrets/": f"{tmp}/secrets/", "/tmp/": f"{tmp}/"}
    return re.sub("|".join(map(re.escape, mapped)), lambda m: mapped[m.group(0)], text.replace("$$", "$"))


@dataclass
class PrivateRedis:
    port: int
    tmp: Path

    def healthcheck(self) -> int:
        """The compose healthcheck's shell command, with redis-cli pointed at this server's port."""
        test = unescape(SERVICES["redis"]["healthcheck"]["test"][1], self.tmp)
        test = test.replace("redis-cli ping", f"redis-cli -p {self.port} ping")
        return subprocess.run(["sh", "-c", test], capture_output=True).returncode


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """redis-server started by the compose file's command: the image's entrypoint and user aside, a private port."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "redis_password").write_text(PASSWORD + "\n")
    (tmp_path / "secrets" / "db_password").write_text("unused-by-trust-auth\n")
    port = free_port()
    shell, flag, script = SERVICES["redis"]["command"]
    script = unescape(script, tmp_path).replace("chown redis", "chown $(id -u)")
    script = script.replace("docker-entrypoint.sh ", "").replace(
        "--appendonly yes", f"--appendonly no --save '' --port {port} --bind 127.0.0.1 --dir {tmp_path}"
    )
    proc = subprocess.Popen([shell, flag, script], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    server = PrivateRedis(port, tmp_path)
    try:
        wait_for(lambda: server.healthcheck() == 0, 15, "the private Redis to answer its healthcheck")
        yield server
    finally:
        proc.terminate()
        proc.wait(10)


def test_redis_takes_its_password_from_the_secret_and_kiln_from_the_same_file(private_redis: PrivateRedis) -> None:
    url = f"redis://127.0.0.1:{private_redis.port}/0"
    conf = private_redis.tmp / "redis-auth.conf"
    assert oct(conf.stat().st_mode & 0o777) == "0o600"  # the config holding the password is the server's alone
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(url).ping()
    # Unauthenticated, redis-cli prints NOAUTH and still exits 0: why the compose healthcheck greps for PONG.
    bare = subprocess.run(["redis-cli", "-p", str(private_redis.port), "ping"], capture_output=True, text=True)
    assert bare.returncode == 0 and "NOAUTH" in bare.stdout
    settings = Settings(broker_url=url, broker_password_file=private_redis.tmp / "secrets" / "redis_password")
    assert redis.Redis.from_url(settings.resolved_broker_url).ping()
    (private_redis.tmp / "secrets" / "redis_password").write_text("wrong\n")
    assert private_redis.healthcheck() != 0


def worker_env(tmp: Path, *, database_url: str, broker_url: str) -> dict[str, str]:
    """The worker's compose environment, its containers' paths mapped, the servers those of this test."""
    env = {k: unescape(str(v), tmp) for k, v in SERVICES["worker-gpu"]["environment"].items()}
    env.update(
        KILN_DATABASE_URL=database_url,
        KILN_BROKER_URL=broker_url,
        KILN_WORKER_ADDRESS="10.20.30.40",
        KILN_STORAGE_DIR=str(tmp / "storage"),
        KILN_HOME=str(tmp / "home"),
        KILN_HEARTBEAT_INTERVAL_S="1",
    )
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env}


def healthcheck(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    _cmd, python, *args = SERVICES["worker-gpu"]["healthcheck"]["test"]
    assert python == "python"
    return subprocess.run([sys.executable, *args, *extra], env=env, cwd=ROOT, capture_output=True, text=True)


def test_the_gpu_worker_command_is_healthy_while_it_heartbeats(private_redis: PrivateRedis, tmp_path: Path) -> None:
    shell, flag, script = SERVICES["worker-gpu"]["command"]
    script = unescape(script, tmp_path).replace("exec python", f"exec {sys.executable}") + " --cpu-slots 1"
    with temporary_database("kiln_deploy") as db_url:
        upgrade(db_url)
        env = worker_env(tmp_path, database_url=db_url, broker_url=f"redis://127.0.0.1:{private_redis.port}/0")
        log = tmp_path / "worker.log"
        proc = subprocess.Popen(
            [shell, flag, script],
            env=env,
            cwd=ROOT,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        engine = make_engine(db_url)
        try:
            # Healthy only once it has reached both servers: the broker (with the secret's password) to declare its
            # queue, PostgreSQL to register and heartbeat.
            wait_for(lambda: healthcheck(env).returncode == 0, 60, f"a healthy worker ({log})")
            with engine.connect() as conn:
                host = conn.execute(select(Host.name, Host.address)).one()
            assert host == (socket.gethostname(), "10.20.30.40")  # the host's name, and --address from the env
            os.kill(proc.pid, signal.SIGSTOP)  # a hung worker: the process exists, its loop does not turn
            stale = wait_for(lambda: healthcheck(env, "--max-age", "3").stderr, 20, "an unhealthy worker")
            assert stale.startswith("heartbeat: last beat") and "stale after 3 s" in stale
            os.kill(proc.pid, signal.SIGCONT)
            wait_for(lambda: healthcheck(env, "--max-age", "3").returncode == 0, 20, "healthy again")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            engine.dispose()


def test_scheduler_health_for_a_leader_a_standby_and_a_leader_that_cannot_cycle(tmp_path: Path) -> None:
    with temporary_database("kiln_deploy") as good, temporary_database("kiln_deploy_nomig") as unmigrated:
        upgrade(good)

        def settings(url: str, name: str) -> Settings:
            return Settings(database_url=url, home=tmp_path, scheduler_interval_s=0.2, liveness_file=tmp_path / name)

        loops = [LoopThread(settings(good, "a.json"), dispatch_attempt)]
        try:
            wait_for(lambda: check(tmp_path / "a.json")[1].startswith("leading"), 20, "a leading beat")
            loops.append(LoopThread(settings(good, "b.json"), dispatch_attempt))
            wait_for(lambda: check(tmp_path / "b.json")[1].startswith("standby"), 20, "a standby beat")
            # Its own database, where it leads at once, but every cycle fails (no schema): it never beats.
            loops.append(LoopThread(settings(unmigrated, "c.json"), dispatch_attempt))
            wait_for(lambda: check(tmp_path / "a.json", max_age_s=1.0)[0], 10, "the first leader still beating")
            assert check(tmp_path / "c.json") == (False, f"{tmp_path / 'c.json'}: no beat yet")
            assert check(tmp_path / "a.json", max_age_s=1.0)[0] and check(tmp_path / "b.json", max_age_s=3.0)[0]
        finally:
            for loop in loops:
                loop.halt()
