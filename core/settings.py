"""Settings from the environment (``KILN_`` prefix). The embedded default needs no server at all."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core.secrets import SecretError, read_secret, with_password


def _default_home() -> Path:
    return Path.cwd() / ".kiln"


def _default_local_tier() -> Path | None:
    shm = Path("/dev/shm")
    return shm / "kiln" if shm.is_dir() else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KILN_", extra="ignore")

    home: Path = Field(default_factory=_default_home, description="State of the embedded default.")
    database_url: str = ""  # default: sqlite file under home
    broker_url: str = ""  # default: kombu's SQLAlchemy transport on a sqlite file under home
    # Files holding the password of the database and of the broker (Docker secrets, /run/secrets/...): it goes
    # into the URL above, which names user, host and database only. See core.secrets.
    database_password_file: Path | None = None
    broker_password_file: Path | None = None
    api_url: str = "http://127.0.0.1:8421"
    host: str = "127.0.0.1"
    port: int = 8421

    # Limits that protect the API.
    max_body_bytes: int = 256 * 1024
    # Server-Sent Events: a keepalive comment after this long without an event (proxies commonly close idle
    # connections after 30-60 s), and how often an open stream checks its caller's token and team again.
    sse_keepalive_s: float = 15.0
    sse_recheck_s: float = 5.0
    rate_limit_per_minute: int = 6000  # per user, whatever number of tokens they use
    rate_limit_burst: int = 600
    max_tokens_per_user: int = 50  # live (unrevoked, unexpired) tokens one user may hold
    auth_failures_per_minute: int = 10  # failed authentications per client address, then 429 until refilled
    auth_failures_burst: int = 20

    # Scheduler and worker timing (seconds).
    scheduler_interval_s: float = 2.0
    lease_s: float = 30.0
    heartbeat_interval_s: float = 5.0
    # Redis redelivers an unacknowledged task message after this long (None: the workers' default of 12 h, see
    # workers.celery_app). Tests lower it to force a redelivery, which the fencing token then refuses.
    broker_visibility_timeout_s: float | None = None

    # Storage for checkpoints, compile caches and logs (a shared filesystem in multi-host deployments).
    storage_dir: Path | None = None
    # The group that may read the attempt logs workers write (the API's, where it runs as another user); unset:
    # owner-only (core/private.py).
    storage_gid: int | None = None
    # A worker's fast host-local directory for tiered checkpoints (tmpfs or local NVMe); each job that asks for
    # the tier (``checkpointing.local_tier``) gets its own directory under it. Default: /dev/shm/kiln where
    # /dev/shm exists; "" turns the tier off on this host.
    local_tier_dir: Path | None = Field(default_factory=_default_local_tier)

    # Host-wide maxima for one attempt on a worker's host (workers/isolation.py). A job's own limit comes from its
    # spec (``resources.host_memory_bytes``; default: the host's share per training process) within these.
    attempt_max_memory_bytes: int | None = None  # None: 80% of the host's memory
    attempt_max_pids: int = 16384  # processes and threads
    attempt_pids_per_process: int = 512  # per training process (a compile's worker pool included)

    # GPU sharing (workers/mps.py): "auto" starts one MPS control daemon per GPU host when the binary is there;
    # "off" never does (fractional jobs then wait: no host offers shares). The binary's name or path.
    mps: Literal["auto", "off"] = "auto"
    mps_control: str = "nvidia-cuda-mps-control"

    @field_validator("local_tier_dir", mode="before")
    @classmethod
    def _empty_is_off(cls, v: object) -> object:
        return None if v == "" else v

    # GPU types of hosts that will join later (comma-separated, e.g. "H100-80GB,H200"): jobs and quotas may name
    # them before any such host registers. Types the hosts have registered are known without this.
    gpu_types: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator("gpu_types", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return [t.strip() for t in value.split(",") if t.strip()] if isinstance(value, str) else value

    # The scheduler loop and the worker's host agent write this file after each iteration that did its work; a
    # container healthcheck (``python -m core.liveness``) reads its age. Unset: nothing is written.
    liveness_file: Path | None = None

    _database_password: str | None = PrivateAttr(default=None)
    _broker_password: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _read_password_files(self) -> Settings:
        """Read the password files at start-up, so a missing or empty secret stops the process at once, by name."""
        pairs = (
            ("KILN_DATABASE_PASSWORD_FILE", self.database_password_file, self.database_url, "_database_password"),
            ("KILN_BROKER_PASSWORD_FILE", self.broker_password_file, self.broker_url, "_broker_password"),
        )
        for name, path, url, attr in pairs:
            if path is None:
                continue
            if not url:
                raise SecretError(f"{name} is set but {name.removesuffix('_PASSWORD_FILE')}_URL is not")
            password = read_secret(path, name)
            with_password(url, password, name)  # refuses a URL it cannot complete, here rather than at first use
            setattr(self, attr, password)
        return self

    @property
    def resolved_database_url(self) -> str:
        if self._database_password is not None:
            return with_password(self.database_url, self._database_password, "KILN_DATABASE_PASSWORD_FILE")
        return self.database_url or f"sqlite:///{self.home / 'kiln.db'}"

    @property
    def resolved_broker_url(self) -> str:
        if self._broker_password is not None:
            return with_password(self.broker_url, self._broker_password, "KILN_BROKER_PASSWORD_FILE")
        return self.broker_url or f"sqla+sqlite:///{self.home / 'broker.db'}"

    @property
    def resolved_storage_dir(self) -> Path:
        return self.storage_dir or self.home / "storage"


@lru_cache
def get_settings() -> Settings:
    return Settings()
