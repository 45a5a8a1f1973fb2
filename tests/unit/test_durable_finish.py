"""A job's success needs its final state on durable storage (issue 39, item 1): the trainer's final checkpoint is
retried through a storage fault and, failing, ends the attempt as a storage failure, never as a success; a script's
commits likewise; the worker's own check of what a success rests on. The fault is real: the checkpoint directory
made read-only by a read-only bind mount (``harness/read_only.py``), which root's writes meet as well.

(A chaos run with the storage read-only for 20 s ended two jobs SUCCEEDED at step 400 while their newest weights
were step 360's: the final save failed, the failure was an event, and the trainer exited 0.)"""

from __future__ import annotations

import json
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from harness.deps import require_module
from harness.read_only import make_read_only, make_writable, read_only, require_mounts
from tests.support.compiler_env import compiler_cache_env_restored  # noqa: F401  (autouse)

torch = require_module("torch")

from core.fence import Lease, lease_clock, write_fence, write_lease  # noqa: E402
from core.spec import parse_spec_data  # noqa: E402
from core.trainer_protocol import (  # noqa: E402
    ENV_CHECKPOINT_DIR,
    ENV_FENCING_TOKEN,
    ENV_FINAL_CHECKPOINT_RETRY_S,
    ENV_KEEP_LAST,
    ENV_LEASE_FILE,
    ENV_RUN_DIR,
    ENV_STEPS,
    ENV_TEST_HOOKS,
    EXIT_DIR,
    ExitCode,
)
from trainer import script_client  # noqa: E402
from trainer.checkpoint.store import list_checkpoints, verify, write_manifest_and_commit  # noqa: E402
from trainer.parallel import DistEnv  # noqa: E402
from workers.final_state import judge  # noqa: E402

EROFS = "Read-only file system"


@pytest.fixture
def storage(tmp_path: pathlib.Path) -> pathlib.Path:
    require_mounts(tmp_path)
    root = tmp_path / "run" / "checkpoints"  # where a bare run (no worker) keeps its checkpoints
    root.mkdir(parents=True)
    return root


def records(tmp: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp / "run" / "telemetry" / "rank0.jsonl").read_text().splitlines()]


def events(tmp: pathlib.Path, type_: str) -> list[dict[str, Any]]:
    return [r for r in records(tmp) if r["kind"] == "event" and r["type"] == type_]


class StorageFault(threading.Thread):
    """Makes the checkpoint directory read-only once the checkpoint of step 2 is committed (the last step is 4, two
    slowed steps later), and, with ``heal``, writable again at the final save's first retry (a remount)."""

    def __init__(self, tmp: pathlib.Path, storage: pathlib.Path, *, heal: bool) -> None:
        super().__init__(name="storage-fault")
        self.telemetry = tmp / "run" / "telemetry" / "rank0.jsonl"
        self.storage, self.heal = storage, heal
        self.done = threading.Event()
        self.mounted = False

    def seen(self, text: str) -> bool:
        return self.telemetry.exists() and text in self.telemetry.read_text()

    def run(self) -> None:
        while not self.done.wait(0.02):
            if not self.mounted and self.seen('"kind":"checkpoint"'):
                make_read_only(self.storage)
                self.mounted = True
            elif self.mounted and self.heal and self.seen("CHECKPOINT_RETRY"):
                make_writable(self.storage)
                self.mounted = False
                return

    def __enter__(self) -> StorageFault:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()
        if self.mounted:
            make_writable(self.storage)


def train(tmp: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> ExitCode:
    """The tiny GPT on the CPU for 4 steps of at least 0.3 s, a checkpoint every 2 (the last one the final)."""
    from trainer.run import run

    monkeypatch.setenv(ENV_TEST_HOOKS, json.dumps({"sleep_per_step_s": 0.3}))
    job = parse_spec_data(
        {
            "name": "x",
            "team": "t",
            "steps": 4,
            "compile": {"mode": "off"},
            "precision": "fp32",
            "checkpointing": {"every_steps": 2, "keep_last": 5},
            "recipe": {
                "name": "gpt",
                "hyperparameters": {"size": "tiny", "corpus": "synthetic", "batch_size": 2, "seq_len": 16},
            },
        }
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    return run(job, tmp / "run", env)


def test_a_final_save_on_read_only_storage_exits_storage_error_never_succeeded(
    tmp_path: pathlib.Path, storage: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FINAL_CHECKPOINT_RETRY_S, "1.5")
    with StorageFault(tmp_path, storage, heal=False):
        code = train(tmp_path, monkeypatch)
    assert code == ExitCode.STORAGE_ERROR
    assert [s for s, _ in list_checkpoints(storage)] == [2]  # the last verified checkpoint: a restart's
    assert not [r for r in records(tmp_path) if r["kind"] == "done"], "no final record without the final state"
    retries = events(tmp_path, "CHECKPOINT_RETRY")
    assert retries and all(EROFS in r["fields"]["error"] for r in retries)
    (exit_,) = events(tmp_path, "EXIT")
    assert exit_["fields"]["exit_code"] == ExitCode.STORAGE_ERROR
    error = exit_["fields"]["error"]  # what the worker makes the attempt's reason and the LOST event's message
    assert error.startswith("checkpoint storage unwritable: the final checkpoint of step 4") and EROFS in error


def test_storage_back_within_the_retry_window_the_final_save_lands(
    tmp_path: pathlib.Path, storage: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FINAL_CHECKPOINT_RETRY_S, "120")
    with StorageFault(tmp_path, storage, heal=True):
        code = train(tmp_path, monkeypatch)
    assert code == ExitCode.SUCCEEDED
    assert [s for s, _ in list_checkpoints(storage)] == [2, 4]
    final = storage / "step_00000004"
    assert verify(final) is None
    (done,) = [r for r in records(tmp_path) if r["kind"] == "done"]
    manifest = json.loads((final / "manifest.json").read_text())
    assert (done["steps"], done["final_loss"]) == (4, manifest["loss"])
    assert events(tmp_path, "CHECKPOINT_RETRY") and events(tmp_path, "CHECKPOINT_RETRY_SAVED")


# ------------------------------------------------------------------------------------------------ script mode


@pytest.fixture
def script_attempt(
    tmp_path: pathlib.Path, storage: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pathlib.Path]:
    run_dir = tmp_path / "run"
    write_fence(storage, 7)
    write_lease(run_dir / "lease", Lease.renewed(token=7, at=lease_clock(), lease_s=600))
    for key, value in {
        ENV_RUN_DIR: run_dir,
        ENV_CHECKPOINT_DIR: storage,
        ENV_FENCING_TOKEN: 7,
        ENV_STEPS: 3,
        ENV_LEASE_FILE: run_dir / "lease",
        ENV_KEEP_LAST: 2,
        ENV_FINAL_CHECKPOINT_RETRY_S: 1.0,
    }.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setattr(script_client, "_CLIENT", None)
    yield run_dir
    if script_client._CLIENT is not None and script_client._CLIENT.tel is not None:
        script_client._CLIENT.tel.close()
    monkeypatch.setattr(script_client, "_CLIENT", None)


def test_a_scripts_commit_on_read_only_storage_exits_storage_error_not_the_users_error(
    tmp_path: pathlib.Path, storage: pathlib.Path, script_attempt: pathlib.Path
) -> None:
    with script_client.checkpoint(2, loss=1.5) as d:
        (d / "w").write_text("step 2")
    with read_only(storage), pytest.raises(script_client.Fenced) as info, script_client.checkpoint(3) as d:
        (d / "w").write_text("step 3")
    assert info.value.code == ExitCode.STORAGE_ERROR  # kiln's code: the rank launcher records it, not a user error
    assert (script_attempt / EXIT_DIR / "script-rank0").read_text() == str(int(ExitCode.STORAGE_ERROR))
    assert [s for s, _ in list_checkpoints(storage)] == [2]
    (failed,) = events(tmp_path, "CHECKPOINT_STORAGE_ERROR")
    assert EROFS in failed["message"]


# ------------------------------------------------------------------------------------------- the worker's check


def commit(root: pathlib.Path, step: int, loss: float) -> pathlib.Path:
    tmp = root / f".tmp-{step}"
    tmp.mkdir(parents=True)
    (tmp / "w").write_text(f"weights {step}")
    write_manifest_and_commit(tmp, root / f"step_{step:08d}", step=step, token=3, meta={"loss": loss})
    return root / f"step_{step:08d}"


def test_the_worker_takes_a_success_only_from_the_final_checkpoint_verified(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "checkpoints"
    commit(root, 360, 2.1828)
    # The final save of step 400 never landed: no success, whatever the trainer said.
    missing = judge(root, final_step=400)
    assert missing.problem is not None and "step 400 is not verified" in missing.problem
    assert "the newest verified one is step 360's" in missing.problem
    # A final checkpoint whose files changed since its commit is no better.
    final = commit(root, 400, 2.0610)
    (final / "w").write_text("weights 401")  # same size, other bytes
    rotten = judge(root, final_step=400)
    assert rotten.problem is not None and "step 400: sha256 mismatch in w" in rotten.problem
    (final / "w").write_text("weights 400")
    ok = judge(root, final_step=400)
    assert ok.problem is None and ok.final is not None
    assert (ok.final.step, ok.final.loss, ok.final.record["token"]) == (400, 2.0610, 3)
    # A script chooses its checkpoints: its result is the newest verified one's, and none is no failure.
    assert judge(root, final_step=None).final == ok.final
    assert judge(tmp_path / "none", final_step=None).final is None
