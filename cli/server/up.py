"""``kiln up``: the whole service on one machine, supervised.

1. Resolve settings (the embedded default: a SQLite file and kombu's SQLAlchemy transport under ``KILN_HOME``;
   PostgreSQL/Redis when ``KILN_DATABASE_URL``/``KILN_BROKER_URL`` are set) and take a lock on ``KILN_HOME`` so
   two ``kiln up`` never share one state directory.
2. Migrate; on first run bootstrap the admin, the ``default`` team and a token, and save the CLI config so that
   ``kiln submit`` works from another terminal. On later runs the saved token is checked against the database and
   re-issued only when it is missing or dead.
3. Start the API (uvicorn), the scheduler loop and a local worker, each in its own process group with its output
   in ``KILN_HOME/logs/<name>.log``; restart any that dies, with exponential backoff.
4. Ctrl-C / SIGTERM: stop the worker first (its training checkpoints while the API still runs), then the scheduler
   and the API; SIGKILL whatever outlives the grace period, grandchildren (torchrun, trainers) included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.app import cli_name
from cli.errors import CliError, ExitCode
from cli.server.supervisor import TAG, ChildSpec, Supervisor, console, stop_summary

READY_WARN_AFTER_S = 90.0
# The banner's last line: `kiln up --detach` returns once it is in the log, the whole banner before it.
BANNER_END = "Ctrl-C stops everything"
LOCK_FILE = "up.lock"  # in KILN_HOME: held (flock) by the running kiln up, its pid written in it
DETACHED_LOG = "up.log"  # in KILN_HOME/logs: the output of a kiln up started with --detach


@dataclass(frozen=True)
class UpOptions:
    host: str = "127.0.0.1"
    port: int = 8421
    cpu_slots: int = 2
    worker: bool = True
    submit_file: str | None = None
    grace_s: float = 30.0


def child_specs(opts: UpOptions, *, hostname: str, python: str = sys.executable) -> list[ChildSpec]:
    """What ``kiln up`` runs, in start order (it stops them in reverse)."""
    specs = [
        ChildSpec(
            "api",
            [
                python,
                "-m",
                "uvicorn",
                "api.app:create_app",
                "--factory",
                "--host",
                opts.host,
                "--port",
                str(opts.port),
                "--no-access-log",
            ],
        ),
        ChildSpec("scheduler", [python, "-m", "scheduler"]),
    ]
    if opts.worker:
        specs.append(
            ChildSpec("worker", [python, "-m", "workers", "--host", hostname, "--cpu-slots", str(opts.cpu_slots)])
        )
    return specs


def connect_host(bind_host: str) -> str:
    return "127.0.0.1" if bind_host in {"0.0.0.0", "", "::"} else bind_host


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def mask_url(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))
    return url


# -- start-up ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def home_lock(home: Path) -> Any:
    import fcntl

    path = home / LOCK_FILE
    fh = path.open("a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        pid = fh.read().strip() or "?"
        fh.close()
        raise CliError(
            f"another `kiln up` (pid {pid}) is running on {home}; stop it first or set KILN_HOME", ExitCode.CONFLICT
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    try:
        yield
    finally:
        fh.close()


@dataclass(frozen=True)
class Credentials:
    api_url: str
    token: str
    user: str
    config_path: Path
    note: str
    profile: str | None = None  # the CLI config's profile for this kiln, when the default is another kiln's


def prepare(database_url: str, api_url: str) -> Credentials:
    """Migrate, bootstrap on first run, and make sure the CLI config holds a live token for ``api_url``."""
    from cli.config import ConfigError, config_path, load_file, normalize_url, save
    from cli.server.bootstrap import BootstrapError, bootstrap, existing_admin, token_owner
    from core.migrate import upgrade

    try:
        upgrade(database_url)
    except Exception as exc:  # alembic raises many kinds; the message is what matters
        raise CliError(f"migrating {mask_url(database_url)} failed: {exc}") from None
    path = config_path()
    try:
        saved = load_file(path)
    except ConfigError:
        saved = {}
    try:
        admin = existing_admin(database_url)
        if admin is None:
            result = bootstrap(database_url, name="admin")
            note = f"first run: created admin '{result.user}', team 'default' and a token"
        else:
            token = saved.get("token")
            owner = token_owner(database_url, str(token)) if token else None
            if owner is not None:  # a live token of this very database
                if saved.get("api_url") != normalize_url(api_url):
                    save(api_url, str(token), path)
                note = f"bootstrap skipped (admin '{admin}' exists); the saved token of '{owner}' is still valid"
                return Credentials(api_url, str(token), owner, path, note)
            result = bootstrap(database_url, name=admin, force=True)
            note = f"admin '{admin}' exists; issued a fresh token (the saved one was missing, revoked or another's)"
    except BootstrapError as exc:
        raise CliError(f"bootstrap failed: {exc}") from None
    other = saved.get("api_url")
    if other not in (None, normalize_url(api_url)):
        # Another kiln's entry: kept as it is; this one is added as a profile beside it.
        profile = profile_name(api_url)
        save(api_url, result.token, path, profile=profile)
        note += (
            f"; the CLI config's default is another kiln ({other}), kept: this one is profile {profile!r} "
            f"(kiln --profile {profile} ..., or KILN_PROFILE={profile})"
        )
        return Credentials(api_url, result.token, result.user, path, note, profile)
    save(api_url, result.token, path)
    return Credentials(api_url, result.token, result.user, path, note)


def profile_name(api_url: str) -> str:
    """``http://127.0.0.1:8421`` -> ``local-8421``."""
    from cli.config import normalize_url

    port = normalize_url(api_url).rsplit(":", 1)[-1]
    return f"local-{port}" if port.isdigit() else "local"


def _claim_storage(database_url: str, storage_dir: Path) -> None:
    """The storage directory is this database's, or kiln does not start (``core.deployment``); the processes check
    it again, this says it once, plainly."""
    from sqlalchemy.orm import Session

    from core.db import make_engine
    from core.deployment import StorageOfAnotherDeployment, check_storage

    engine = make_engine(database_url)
    try:
        with Session(engine) as db:
            check_storage(db, storage_dir)
    except StorageOfAnotherDeployment as exc:
        raise CliError(str(exc), ExitCode.CONFLICT) from None
    finally:
        engine.dispose()


def _local_host(database_url: str) -> None:
    """Say what this host offers to the local worker, and give the ``default`` team its GPUs."""
    import shutil

    from cli.server.bootstrap import BootstrapError, give_default_team_gpus
    from core.gpu_types import canonical
    from workers.inventory import local_gpus

    gpus = local_gpus()
    if not gpus:
        console.print(f"{TAG} this host: no GPU (NVML found none): jobs train on CPU slots")
        return
    groups: dict[str, list[Any]] = {}
    for g in gpus:
        groups.setdefault(canonical(g.model), []).append(g)
    described = ", ".join(
        f"{len(gs)} x {t} ({gs[0].model}, {gs[0].memory_bytes / 2**30:.0f} GiB)" for t, gs in sorted(groups.items())
    )
    by_type = {t: len(gs) for t, gs in groups.items()}
    mps = shutil.which("nvidia-cuda-mps-control")
    if mps and os.environ.get("KILN_ISOLATION", "sandbox") != "none":
        # workers/__main__.py: an MPS client cannot connect from inside the sandbox yet, so no shares are offered
        said = f"installed ({mps}), but GPU shares are off while jobs run sandboxed (docs/security.md)"
    else:
        said = f"available ({mps})" if mps else "not installed"
    console.print(f"{TAG} this host: {described}; MPS {said}")
    try:
        added = give_default_team_gpus(database_url, by_type)
    except BootstrapError as exc:
        raise CliError(f"could not give the default team this host's GPUs: {exc}") from None
    if added:
        console.print(f"{TAG} team 'default' may use this host's GPUs: quota {', '.join(added)} (any GPU type)")


def keep_private(home: Path) -> Path:
    """KILN_HOME holds the database (token hashes, every team's jobs), the broker, the logs and the checkpoints:
    kiln up and everything it starts create files for their user alone (umask 077), and what an older version left
    readable to others is narrowed. Returns the log directory."""
    from core.private import narrow, private_dir

    os.umask(0o077)  # inherited by the API, the scheduler, the worker and its trainers
    private_dir(home)
    log_dir = private_dir(home / "logs")
    for path in [*home.glob("*.db*"), *log_dir.glob("*.log"), home / "storage"]:
        narrow(path)
    return log_dir


def child_env(settings: Any, opts: UpOptions, api_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        KILN_HOME=str(settings.home),
        KILN_DATABASE_URL=settings.resolved_database_url,
        KILN_BROKER_URL=settings.resolved_broker_url,
        KILN_API_URL=api_url,
        KILN_HOST=opts.host,
        KILN_PORT=str(opts.port),
        PYTHONUNBUFFERED="1",
    )
    env.pop("KILN_TOKEN", None)  # children authenticate as services, not as the CLI user
    # The scheduler's and the worker's own metrics on the two ports after the API's (unless set: 0 turns one off),
    # on KILN_METRICS_BIND (127.0.0.1 unless set): they take no token.
    env.setdefault("KILN_SCHEDULER_METRICS_PORT", str(opts.port + 1))
    env.setdefault("KILN_WORKER_METRICS_PORT", str(opts.port + 2))
    return env


def metrics_urls(sup: Supervisor, api_url: str) -> list[str]:
    """Where each child's Prometheus metrics are: the API's /metrics (a scrape token's) and the listeners of the
    scheduler and the worker that :func:`child_env` turned on."""
    urls = [f"api {api_url}/metrics (a token of the metrics scope)"]
    bind = connect_host(sup.env.get("KILN_METRICS_BIND", "127.0.0.1"))
    for child in sup.children[1:]:
        port = sup.env.get(f"KILN_{child.name.upper()}_METRICS_PORT", "0")
        if port != "0":
            urls.append(f"{child.name} http://{bind}:{port}/metrics")
    return urls


def api_ready(api_url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{api_url}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def run_up(opts: UpOptions) -> int:
    from core.settings import Settings

    settings = Settings()
    home = settings.home.resolve()
    settings = settings.model_copy(update={"home": home})
    log_dir = keep_private(home)
    api_url = f"http://{connect_host(opts.host)}:{opts.port}"

    with home_lock(home):
        if port_in_use(opts.host, opts.port):
            raise CliError(
                f"port {opts.port} on {opts.host} is in use — is kiln already up? (choose another with --port)",
                ExitCode.CONFLICT,
            )
        console.print(f"{TAG} state in {home}")
        console.print(f"{TAG} database {mask_url(settings.resolved_database_url)}")
        console.print(f"{TAG} broker   {mask_url(settings.resolved_broker_url)}")
        creds = prepare(settings.resolved_database_url, api_url)
        _claim_storage(settings.resolved_database_url, settings.resolved_storage_dir)
        console.print(f"{TAG} migrated; {creds.note}")
        console.print(f"{TAG} CLI config: {creds.config_path} (api {api_url}, user {creds.user})")
        if opts.worker:
            _local_host(settings.resolved_database_url)

        specs = child_specs(opts, hostname=socket.gethostname())
        sup = Supervisor(specs, env=child_env(settings, opts, api_url), log_dir=log_dir)
        stop = threading.Event()
        force = threading.Event()

        def on_signal(signum: int, _frame: Any) -> None:
            if stop.is_set():
                force.set()
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            sup.start_all()
            for child in sup.children:
                console.print(f"{TAG} {child.name:<9} pid {child.pid:<7} log {child.log_path}")
            _supervise(sup, opts, api_url, creds.token, stop, profile=creds.profile)
        finally:
            console.print(f"{TAG} stopping (Ctrl-C again to kill at once)")
            codes = sup.stop(opts.grace_s, force)
            for s, handler in previous.items():
                signal.signal(s, handler)
        console.print(f"{TAG} stopped ({stop_summary(codes)})")
    return 0


def _supervise(
    sup: Supervisor, opts: UpOptions, api_url: str, token: str, stop: threading.Event, *, profile: str | None = None
) -> None:
    started = time.monotonic()
    ready = False
    warned = False
    while not stop.is_set():
        sup.poll()
        if not ready:
            if api_ready(api_url):
                ready = True
                _banner(sup, api_url, token, profile)
                if opts.submit_file:
                    _submit(opts.submit_file, api_url, token)
            elif not warned and time.monotonic() - started > READY_WARN_AFTER_S:
                warned = True
                console.print(
                    f"{TAG} [yellow]the API is not ready after {READY_WARN_AFTER_S:.0f}s[/]; "
                    f"see {sup.children[0].log_path}"
                )
        stop.wait(0.5 if ready else 0.2)


def _banner(sup: Supervisor, api_url: str, token: str, profile: str | None = None) -> None:
    logs = ", ".join(str(c.log_path) for c in sup.children)
    cli = cli_name() + (f" --profile {profile}" if profile else "")
    console.print(f"{TAG} [bold green]kiln is up[/]: API {api_url}/v1 (docs {api_url}/docs, dashboard {api_url}/)")
    console.print(f"{TAG} logs: {logs}")
    console.print(f"{TAG} metrics: {', '.join(metrics_urls(sup, api_url))}")
    print_token(token, own_log=sup.children[0].log_path.parent / DETACHED_LOG)
    console.print(f"{TAG} next, in another terminal:  {cli} submit examples/gpt-tiny.yaml --follow")
    console.print(f"{TAG} {BANNER_END}")


def print_token(token: str, own_log: Path | None = None) -> None:
    """A local, single-user service: the admin's token is shown so the dashboard can be signed in to, wherever the
    output of the command the user ran goes (a terminal, a pipe, a file of theirs), but never into kiln's own log
    (``own_log``: the detached kiln up's ``up.log``; ``kiln up --detach`` prints it to the user instead)."""
    if own_log is not None and writes_to(own_log):
        from cli.config import config_path

        console.print(f"{TAG} dashboard sign-in token: in the CLI config, {config_path()} (not written to logs)")
    else:
        console.print(f"{TAG} dashboard sign-in token (also in the CLI config): {token}", soft_wrap=True)


def writes_to(path: Path) -> bool:
    """Whether standard output is the file at ``path``."""
    try:
        out, file = os.fstat(sys.stdout.fileno()), path.stat()
    except (OSError, ValueError):  # no such file; an output with no descriptor (io.UnsupportedOperation)
        return False
    return (out.st_dev, out.st_ino) == (file.st_dev, file.st_ino)


def _submit(path: str, api_url: str, token: str) -> None:
    """``--submit FILE``: submit once the API is ready; an error is reported and kiln keeps running."""
    from cli.client import KilnClient
    from cli.commands.job_input import read_spec_file
    from cli.commands.jobs import submit_text
    from cli.config import CliConfig

    try:
        text = read_spec_file(path)
        with KilnClient(CliConfig(api_url, token, "kiln up", "kiln up")) as api:
            job = submit_text(api, text)
    except CliError as exc:
        console.print(f"{TAG} [red]--submit {path} failed[/]: {exc.message}")
        for line in exc.details:
            console.print(f"    {line}", markup=False)
        return
    console.print(f"{TAG} submitted job {job['id']} ({job.get('name')}); follow it: {cli_name()} logs -f {job['id']}")
