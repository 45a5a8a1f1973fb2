"""The trainer under faults: who caused a failure, test hooks only from the worker's environment, the lease and
the fence that end an attempt's right to commit (CPU, tiny tensors, no subprocesses)."""

from __future__ import annotations

import json
import pathlib
import threading
import time
from typing import Any

import pytest

from harness.deps import require_module
from tests.support.compiler_env import compiler_cache_env_restored  # noqa: F401  (autouse)

torch = require_module("torch")

import torch.distributed as dist  # noqa: E402

from core.fence import Lease, lease_clock, read_fence, revoke_fence, write_fence, write_lease  # noqa: E402
from core.spec import JobSpec, SpecError, parse_spec_data  # noqa: E402
from core.telemetry import Telemetry  # noqa: E402
from core.trainer_protocol import ENV_TEST_HOOKS, ExitCode  # noqa: E402
from trainer import config  # noqa: E402
from trainer.checkpoint import Checkpointer, FencedError, list_checkpoints, write_manifest_and_commit  # noqa: E402
from trainer.config import ConfigError, TrainerConfig  # noqa: E402
from trainer.lease import LeaseExpired, LeaseGuard  # noqa: E402
from trainer.user_error import UserError, user_code  # noqa: E402


def spec(**hp: object) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "team": "t", "recipe": {"name": "gpt", "hyperparameters": hp}})


def records(tmp: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp / "run" / "telemetry" / "rank0.jsonl").read_text().splitlines()]


# ---- who caused it -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raised", "blamed_on_user"),
    [
        (ValueError("corpus shorter than one sequence"), True),
        (OverflowError("int too large to convert to float"), True),
        (RuntimeError("shape '[8, 128, 3, 42]' is invalid for input of size 131072"), True),
        (AssertionError("n_embd"), True),
        (OSError(5, "Input/output error"), False),
        (MemoryError(), False),
        (torch.OutOfMemoryError("CUDA out of memory"), False),
        (dist.DistBackendError("NCCL communicator was aborted"), False),
        # What gloo raised on CPU when the other host's rank was SIGKILLed during a gang job (tests/e2e/test_gang_e2e).
        (
            RuntimeError(
                "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                "[127.0.0.1]:17841: Connection reset by peer."
            ),
            False,
        ),
        (torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), False),
    ],
)
def test_user_code_blames_the_user_not_the_machine(raised: Exception, blamed_on_user: bool) -> None:
    with pytest.raises(UserError if blamed_on_user else type(raised)) as info, user_code("building the data"):
        raise raised
    if blamed_on_user:
        assert isinstance(info.value, UserError)
        assert info.value.line == f"building the data: {type(raised).__name__}: {str(raised).splitlines()[0]}"


def test_a_mistake_building_the_data_exits_user_error_with_its_line(tmp_path: pathlib.Path) -> None:
    from trainer.parallel import DistEnv
    from trainer.run import run

    # Each value is valid on its own; together the corpus is shorter than one sequence.
    job = parse_spec_data(
        {
            "name": "x",
            "team": "t",
            "steps": 2,
            "compile": {"mode": "off"},
            "recipe": {"name": "gpt", "hyperparameters": {"size": "tiny", "corpus_bytes": 4096, "seq_len": 8192}},
        }
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    assert run(job, tmp_path / "run", env) == ExitCode.USER_ERROR
    last = records(tmp_path)[-1]
    assert last["type"] == "EXIT" and last["fields"]["exit_code"] == ExitCode.USER_ERROR
    assert last["fields"]["error"] == "building the data: ValueError: corpus shorter than one sequence"


def test_a_resume_with_no_step_left_reports_its_checkpoints_step_and_loss(tmp_path: pathlib.Path) -> None:
    # A lost attempt's trainer once committed the final checkpoint; the next attempt resumed from it, trained 0
    # steps, and the job was recorded with a stale step and no loss. The final record is the checkpoint's.
    from trainer.parallel import DistEnv
    from trainer.run import run

    job = parse_spec_data(
        {
            "name": "x",
            "team": "t",
            "steps": 3,
            "compile": {"mode": "off"},
            "precision": "fp32",
            "checkpointing": {"every_steps": 3},
            "recipe": {
                "name": "gpt",
                "hyperparameters": {"size": "tiny", "corpus": "synthetic", "batch_size": 2, "seq_len": 16},
            },
        }
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    assert run(job, tmp_path / "run", env) == ExitCode.SUCCEEDED
    assert run(job, tmp_path / "run", env) == ExitCode.SUCCEEDED  # the same job again: nothing left to train
    recs = records(tmp_path)
    first, second = [r for r in recs if r["kind"] == "done"]
    (resumed,) = [r for r in recs if r["kind"] == "resumed"]
    (ckpt,) = [r for r in recs if r["kind"] == "checkpoint"]
    manifest = json.loads((tmp_path / "run" / "checkpoints" / "step_00000003" / "manifest.json").read_text())
    assert first["final_loss"] is not None and first["steps"] == 3
    assert (second["steps"], second["final_loss"]) == (3, first["final_loss"])
    assert (resumed["step"], resumed["loss"], resumed["sha256"]) == (3, first["final_loss"], ckpt["sha256"])
    assert manifest["loss"] == ckpt["loss"] == first["final_loss"]


# ---- test hooks: the worker's environment, never the spec ----------------------------------------------
def test_test_hooks_come_from_the_environment_only() -> None:
    assert config.TestHooks.from_env({}) == config.TestHooks()
    raw = json.dumps({"loss_spike_at_step": [3, 9], "sleep_per_step_s": 0.1})
    hooks = config.TestHooks.from_env({ENV_TEST_HOOKS: raw})
    assert hooks.loss_spike_at_step == (3, 9) and hooks.sleep_per_step_s == 0.1 and not hooks.compile_oom
    with pytest.raises(ConfigError, match="compile_ooom"):
        config.TestHooks.from_env({ENV_TEST_HOOKS: json.dumps({"compile_ooom": True})})


@pytest.mark.parametrize("name", ["inject_compile_oom", "inject_loss_spike_at_step", "test_sleep_per_step_s"])
def test_a_spec_naming_a_test_hook_is_refused(name: str) -> None:
    with pytest.raises(SpecError, match=f"unknown hyperparameter {name!r}"):  # at submit
        parse_spec_data({"name": "t", "team": "t", "recipe": {"name": "gpt", "hyperparameters": {name: 1}}})
    with pytest.raises(ConfigError, match=name):  # and by the trainer, whatever let it through
        TrainerConfig.from_spec(spec(**{name: 1}))


# ---- the fence -----------------------------------------------------------------------------------------
def test_revoking_the_fence_touches_only_the_lost_token(tmp_path: pathlib.Path) -> None:
    ckpt = tmp_path / "checkpoints" / "7"
    assert not revoke_fence(ckpt, 3) and not ckpt.exists()  # no storage here: nothing created
    write_fence(ckpt, 3)
    assert not revoke_fence(ckpt, 2)  # not the token named: a newer attempt's fence is left alone
    assert read_fence(ckpt) == "3"
    assert revoke_fence(ckpt, 3)
    assert read_fence(ckpt) == "revoked:3"
    write_fence(ckpt, 4)  # the next attempt claims the job
    assert not revoke_fence(ckpt, 3) and read_fence(ckpt) == "4"


# ---- the lease -----------------------------------------------------------------------------------------
class Run:
    """A rank's view: its lease file, the job's fence, its telemetry."""

    def __init__(self, tmp: pathlib.Path, token: int = 5) -> None:
        self.tmp, self.token = tmp, token
        self.ckpt = tmp / "ckpt"
        write_fence(self.ckpt, token)
        self.lease_file = tmp / "lease"
        self.tel = Telemetry(tmp / "run", 0)

    def lease(self, remaining_s: float, lease_s: float = 0.6) -> None:
        write_lease(self.lease_file, Lease(token=self.token, expires=lease_clock() + remaining_s, lease_s=lease_s))

    def guard(self) -> LeaseGuard:
        return LeaseGuard(
            self.lease_file,
            token=self.token,
            telemetry=self.tel,
            fence_ok=lambda: read_fence(self.ckpt) == str(self.token),
        )

    def events(self) -> list[str]:
        return [r["type"] for r in records(self.tmp) if r["kind"] == "event"]


def test_a_valid_lease_costs_nothing_and_no_lease_file_means_no_worker(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path)
    run.lease(60.0)
    guard = run.guard()
    guard.ensure("step 1")
    run.lease_file.unlink()  # cached until it would expire: the file is not read again on every step
    guard.ensure("step 2")
    LeaseGuard(None, token=5, fence_ok=lambda: False, telemetry=run.tel).ensure("a standalone run")


def test_an_expired_lease_waits_and_carries_on_when_renewed(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path)
    run.lease(-0.1, lease_s=10.0)

    def renew_once_the_rank_waits() -> None:  # the worker renews while the rank waits (it would wait 10 s)
        telemetry = tmp_path / "run" / "telemetry" / "rank0.jsonl"
        deadline = time.monotonic() + 30
        while not (telemetry.exists() and "LEASE_EXPIRED" in telemetry.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        run.lease(60.0)

    threading.Thread(target=renew_once_the_rank_waits, daemon=True).start()
    run.guard().ensure("step 9")  # returns only once renewed: the renewal waits for the rank to say it waits
    assert run.events() == ["LEASE_EXPIRED", "LEASE_RENEWED"]


def test_an_expired_lease_stops_at_the_revoked_fence(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path)
    run.lease(-0.1, lease_s=10.0)
    threading.Timer(0.3, revoke_fence, args=(run.ckpt, run.token)).start()
    with pytest.raises(FencedError) as info:
        run.guard().ensure("step 9")
    assert not isinstance(info.value, LeaseExpired)


def test_a_lease_never_renewed_ends_the_attempt(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path)
    run.lease(-0.1, lease_s=0.4)  # the fence cannot be revoked (storage away): one more lease, then out
    with pytest.raises(LeaseExpired):
        run.guard().ensure("step 9")
    write_lease(run.lease_file, Lease(token=run.token + 1, expires=lease_clock() + 60, lease_s=0.4))
    with pytest.raises(LeaseExpired):  # another attempt's lease gives this one no right
        run.guard().ensure("step 9")


def test_no_commit_without_the_lease(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path)
    run.lease(-0.1, lease_s=0.3)
    tmp = run.ckpt / ".tmp-z"
    tmp.mkdir()
    (tmp / "a.bin").write_bytes(b"x")
    with pytest.raises(LeaseExpired):
        write_manifest_and_commit(
            tmp, run.ckpt / "step_00000003", step=3, token=run.token, meta={}, lease=run.guard().ensure
        )
    assert list_checkpoints(run.ckpt) == [] and not tmp.exists()

    # The checkpointer's background writer obeys it too, and the loop hears of it at the next wait().
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ck = Checkpointer(
        run.ckpt,
        rank=0,
        world_size=1,
        token=run.token,
        keep_last=3,
        asynchronous=True,
        sharded=False,
        group=None,
        device=torch.device("cpu"),
        telemetry=run.tel,
        lease=run.guard().ensure,
    )
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    ck.save(1, model, opt, {"step": 1, "loss": 2.5})
    with pytest.raises(LeaseExpired):
        ck.wait()
    assert list_checkpoints(run.ckpt) == []
    run.lease(60.0)
    ck.save(2, model, opt, {"step": 2, "loss": 2.25}, blocking=True)
    ((step, path),) = list_checkpoints(run.ckpt)
    manifest = json.loads((path / "manifest.json").read_text())
    assert (step, manifest["loss"], manifest["fencing_token"]) == (2, 2.25, run.token)
