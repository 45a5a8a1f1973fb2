"""The deployment files, read as data (no Docker engine needed): the Dockerfile's layer order and contents, and the
invariants of docker-compose.yml that a production deployment depends on."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, Any] = COMPOSE["services"]
KILN_SERVICES = [name for name, svc in SERVICES.items() if "build" in svc]


# ------------------------------------------------------------------------------------------------- Dockerfile


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> [(INSTRUCTION, arguments)], continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, args = line.partition(" ")
        if op == "FROM":
            current = []
            stages[args.split(" AS ")[-1].strip()] = current
        current.append((op, args.strip()))
    return stages


def packages() -> list[str]:
    """The top-level packages the wheel ships (pyproject's setuptools find ``include``)."""
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    return [p.rstrip("*") for p in include]


def test_dependencies_are_installed_before_the_source_in_both_images() -> None:
    stages = dockerfile_stages()
    base_copies = [args for op, args in stages["base"] if op == "COPY"]
    assert base_copies == ["pyproject.toml ./", "scripts/pyproject_deps.py ./scripts/"]  # no source before the deps
    for name in ("control", "worker"):
        steps = stages[name]
        assert steps[0] == ("FROM", f"base AS {name}")
        ops = [f"{op} {args}" for op, args in steps]
        deps = next(i for i, s in enumerate(ops) if "pip install" in s)
        source = ops.index("COPY --from=source /src/ ./")
        assert "pyproject_deps.py" in ops[deps] and "-r /tmp/requirements.txt" in ops[deps]
        assert deps < source, f"{name}: the source is copied before the dependencies are installed"
        after = [s for s in ops[source + 1 :] if "pip install" in s]
        assert after == ["RUN pip install --no-deps ."], f"{name}: after the source only kiln itself may install"
        assert not any(op == "COPY" and "--from=source" not in args for op, args in steps), name


def test_the_source_stage_copies_every_package_the_wheel_ships() -> None:
    copied = {src for op, args in dockerfile_stages()["source"] if op == "COPY" for src in args.split()[:-1]}
    assert {"README.md", "pyproject.toml", *packages()} <= copied


def test_worker_image_has_a_c_compiler_and_the_torch_the_tests_run() -> None:
    worker = " ".join(f"{op} {args}" for op, args in dockerfile_stages()["worker"])
    install = re.search(r"apt-get install ([^&]+)", worker)
    assert install is not None and {"gcc", "libc6-dev"} <= set(install.group(1).split())  # Triton's launcher build
    assert worker.index("gcc") < worker.index("COPY --from=source")
    pinned = re.search(r"ARG TORCH_VERSION=(\S+)", worker)
    bootstrap = re.search(r'"torch==([^"]+)"', (ROOT / "scripts" / "bootstrap").read_text())
    assert pinned is not None and bootstrap is not None
    assert pinned.group(1) == bootstrap.group(1), "the image's torch differs from the one the tests run"
    assert '"torch==${TORCH_VERSION}"' in worker


def test_dockerignore_keeps_secrets_and_local_state_out_but_not_what_the_image_copies() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", ".kiln", "secrets", ".env"} <= ignored
    copied = {"README.md", "pyproject.toml", "scripts", *packages()}
    assert not copied & ignored


# --------------------------------------------------------------------------------------------- docker-compose


def env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in SERVICES[service]["environment"].items()}


def test_no_password_has_a_default_and_kiln_reads_them_from_secret_files() -> None:
    defaults = dict(re.findall(r"\$\{(\w+):?-([^}]*)\}", COMPOSE_TEXT))
    assert defaults == {"KILN_WORKER_ADDRESS": ""}  # checked by the worker's own command, below
    for name, svc in SERVICES.items():
        for key in svc.get("environment", {}):
            assert not key.endswith(("PASSWORD", "SECRET")), f"{name}: {key} would put a secret in the environment"
    for name in KILN_SERVICES:
        assert set(SERVICES[name]["secrets"]) == {"db_password", "redis_password"}, name
        assert env(name)["KILN_DATABASE_PASSWORD_FILE"] == "/run/secrets/db_password"
        assert env(name)["KILN_BROKER_PASSWORD_FILE"] == "/run/secrets/redis_password"
        for key in ("KILN_DATABASE_URL", "KILN_BROKER_URL"):
            userinfo = env(name)[key].split("//", 1)[1].rpartition("@")[0]
            assert ":" not in userinfo, f"{name}: a password in {key}"
    assert env("postgres")["POSTGRES_PASSWORD_FILE"] == "/run/secrets/db_password"
    assert "requirepass" in " ".join(SERVICES["redis"]["command"])
    for secret in COMPOSE["secrets"].values():
        assert secret["file"].startswith("${KILN_SECRETS_DIR:?"), "a secret file must come from the operator"


def test_storage_is_a_shared_filesystem_mounted_by_the_api_and_the_worker() -> None:
    storage = COMPOSE["volumes"]["storage"]
    assert storage["driver_opts"]["type"] == "nfs"
    assert "addr=${KILN_NFS_SERVER:?" in storage["driver_opts"]["o"]
    assert "hard" in storage["driver_opts"]["o"].split(",")  # a soft mount can fail a write the trainer thinks done
    assert storage["driver_opts"]["device"].startswith(":${KILN_NFS_EXPORT:?")
    for name in ("api", "worker-gpu"):
        assert f"storage:{env(name)['KILN_STORAGE_DIR']}" in SERVICES[name]["volumes"], name


def test_gpu_worker_uses_host_networking_and_a_reachable_rendezvous_address() -> None:
    worker = SERVICES["worker-gpu"]
    assert worker["network_mode"] == "host"
    assert "hostname" not in worker  # Docker refuses a hostname with host networking; the host's own is used
    for key in ("KILN_DATABASE_URL", "KILN_BROKER_URL"):  # not the compose network's names: it has none
        host = re.sub(r"^[\w+]+://([^@/]*@)?", "", env("worker-gpu")[key])
        assert host.startswith("${KILN_CONTROL_ADDRESS:?"), key
    assert env("worker-gpu")["NCCL_NVLS_ENABLE"] == "0"
    assert worker["ipc"] == "host"
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_the_gpu_worker_sandboxes_its_attempts_and_nothing_turns_the_sandbox_off() -> None:
    """The worker sets each attempt's sandbox up as root inside its container (workers/sandbox.py): namespaces and
    mounts need CAP_SYS_ADMIN, unconfined seccomp and AppArmor, and an unmasked /proc; the image has bubblewrap."""
    worker = SERVICES["worker-gpu"]
    assert "SYS_ADMIN" in worker["cap_add"]
    assert {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"} <= set(worker["security_opt"])
    assert "privileged" not in worker
    for name in SERVICES:
        assert not {"KILN_ISOLATION", "KILN_ATTEMPT_UID_BASE"} & set(SERVICES[name].get("environment") or {}), name
    assert "bubblewrap" in (ROOT / "Dockerfile").read_text()


def test_worker_stop_grace_outlasts_its_own_graceful_shutdown() -> None:
    from core.settings import Timings

    grace = SERVICES["worker-gpu"]["stop_grace_period"]
    seconds = int(grace.rstrip("s"))
    assert seconds > Timings().drain_timeout_s > Timings().stop_grace_s


@pytest.mark.parametrize("service", ["scheduler", "worker-gpu"])
def test_scheduler_and_worker_healthchecks_read_their_liveness_file(service: str) -> None:
    check = SERVICES[service]["healthcheck"]
    assert check["test"] == ["CMD", "python", "-m", "core.liveness"]
    assert env(service)["KILN_LIVENESS_FILE"].startswith("/tmp/")  # each container's own, writable by kiln's user
    assert int(check["interval"].rstrip("s")) <= 10


def test_the_api_keeps_its_readiness_healthcheck() -> None:
    assert "/readyz" in " ".join(SERVICES["api"]["healthcheck"]["test"])
