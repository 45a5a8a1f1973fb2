"""Script mode (spec ``command:``, docs/user-code.md): the spec's rules, the client a script imports (against a real
fence, lease and checkpoint directory) and how a script's end is classified. The rank launcher running real
commands: tests/e2e/test_script_launcher.py."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.fence import Lease, lease_clock, revoke_fence, write_fence, write_lease
from core.spec import SpecError, parse_spec_text
from core.trainer_protocol import (
    ENV_CHECKPOINT_DIR,
    ENV_FENCING_TOKEN,
    ENV_KEEP_LAST,
    ENV_LEASE_FILE,
    ENV_RUN_DIR,
    EXIT_DIR,
    TELEMETRY_DIR,
    ExitCode,
)
from rank.script import classify_exit, command_of
from trainer import script_client
from trainer.checkpoint.store import MANIFEST, list_checkpoints, verify

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "name: s\nteam: default\ncommand: [python, train.py]\n"


# ------------------------------------------------------------------------------------------------------ the spec


def errors(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec_text(text)
    return [f"{e['loc']}: {e['msg']}" for e in info.value.errors]


def test_a_command_is_the_alternative_to_a_recipe() -> None:
    spec = parse_spec_text(SCRIPT + "code: {digest: " + "a" * 64 + "}\n")
    assert spec.command == ["python", "train.py"] and spec.recipe is None and spec.is_script
    assert spec.recipe_name == "script"
    assert parse_spec_text(SCRIPT).command == ["python", "train.py"]  # before --workdir fills in the digest


def test_exactly_one_of_recipe_and_command() -> None:
    (neither,) = errors("name: s\nteam: default\n")
    assert "either a `recipe:`" in neither and "or a `command:`" in neither
    (both,) = errors(SCRIPT + "recipe: {name: gpt}\n")
    assert "not both" in both


def test_a_command_names_no_entry_point_and_a_recipe_with_code_needs_one() -> None:
    (msg,) = errors(SCRIPT + "code: {entry_point: train}\n")
    assert "code.entry_point names a recipe module" in msg
    (msg,) = errors("name: s\nteam: default\nrecipe: {name: mine}\ncode: {digest: " + "a" * 64 + "}\n")
    assert "code.entry_point is required with `recipe:`" in msg


@pytest.mark.parametrize("command", ["[]", '[""]', "python train.py"])
def test_a_command_is_a_non_empty_argv(command: str) -> None:
    found = errors(f"name: s\nteam: default\ncommand: {command}\n")
    assert found and all(f.startswith("command") for f in found), found


def test_python_in_the_command_is_kilns_interpreter() -> None:
    assert command_of({"command": ["python", "t.py"]}) == [sys.executable, "t.py"]
    assert command_of({"command": ["bash", "run.sh"]}) == ["bash", "run.sh"]


# ---------------------------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    ("returncode", "last", "intended", "code", "error"),
    [
        (0, None, None, 0, None),
        (1, "ValueError: lr must be positive", None, 2, "ValueError: lr must be positive (exit code 1)"),
        (3, None, None, 2, "the command exited with code 3 and wrote nothing to stderr"),
        (-9, "anything", None, None, None),  # killed (worker, host OOM killer): not the script's doing
        (137, "Killed", None, None, None),  # the same through a shell
        (76, "kiln: fence moved", 76, 76, None),  # the client made it exit FENCED
        (76, "SystemExit: 76", None, 2, "SystemExit: 76 (exit code 76)"),  # the script's own 76 is its own
        (1, "torch.OutOfMemoryError: CUDA out of memory.", None, 78, None),
        (1, "torch.distributed.DistBackendError: NCCL error in ...", None, 79, None),
    ],
)
def test_how_a_scripts_end_is_classified(
    returncode: int, last: str | None, intended: int | None, code: int | None, error: str | None
) -> None:
    assert classify_exit(returncode, last, intended) == (code, error)


# ------------------------------------------------------------------------------------------------ the client


@pytest.fixture
def attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """The environment a worker gives a rank: run dir, checkpoint dir with the fence, a valid lease."""
    run_dir, ckpt = tmp_path / "run", tmp_path / "checkpoints"
    run_dir.mkdir()
    write_fence(ckpt, 7)
    write_lease(run_dir / "lease", Lease.renewed(token=7, at=lease_clock(), lease_s=600))
    for key, value in {
        ENV_RUN_DIR: run_dir,
        ENV_CHECKPOINT_DIR: ckpt,
        ENV_FENCING_TOKEN: 7,
        ENV_LEASE_FILE: run_dir / "lease",
        ENV_KEEP_LAST: 2,
    }.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(script_client, "_CLIENT", None)
    yield {"run": run_dir, "ckpt": ckpt}
    if script_client._CLIENT is not None and script_client._CLIENT.tel is not None:
        script_client._CLIENT.tel.close()
    monkeypatch.setattr(script_client, "_CLIENT", None)


def records(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / TELEMETRY_DIR / "rank0.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_report_writes_the_trainers_step_records(attempt: dict[str, Path]) -> None:
    script_client.report(1, 2.5)
    script_client.report(3, 2.0, metrics={"acc": 0.5})
    steps = [r for r in records(attempt["run"]) if r["kind"] == "step"]
    assert [s["step"] for s in steps] == [1, 3] and [s["loss"] for s in steps] == [2.5, 2.0]
    assert steps[0]["step_time_s"] is None  # nothing to measure the first step from
    assert isinstance(steps[1]["step_time_s"], float) and steps[1]["step_time_s"] >= 0
    assert steps[1]["metrics"] == {"acc": 0.5}


def test_checkpoints_commit_verified_under_the_fence_and_the_newest_is_resumed(attempt: dict[str, Path]) -> None:
    for step in (10, 20, 30):
        with script_client.checkpoint(step, loss=1.0 / step) as d:
            (d / "state.bin").write_bytes(bytes([step]) * 100)
    committed = list_checkpoints(attempt["ckpt"])
    assert [s for s, _ in committed] == [20, 30]  # keep_last 2
    assert all(verify(p) is None for _, p in committed)
    manifest = json.loads((committed[-1][1] / MANIFEST).read_text())
    assert manifest["fencing_token"] == 7 and manifest["format"] == "script"

    latest = script_client.latest_checkpoint()
    assert latest is not None and latest.step == 30 and latest.loss == pytest.approx(1 / 30)
    assert (latest.path / "state.bin").read_bytes() == bytes([30]) * 100
    kinds = [r["kind"] for r in records(attempt["run"])]
    assert kinds.count("checkpoint") == 3 and kinds[-1] == "resumed"
    # the step after a commit is marked as overlapped by kiln's work: the SLA's step time leaves it out
    script_client.report(31, 0.1)
    assert records(attempt["run"])[-1]["overhead"] == "save"


def test_a_corrupt_checkpoint_is_skipped(attempt: dict[str, Path]) -> None:
    for step in (1, 2):
        with script_client.checkpoint(step) as d:
            (d / "w").write_text(f"weights {step}")
    (attempt["ckpt"] / "step_00000002" / "w").write_text("rotten!!!")
    latest = script_client.latest_checkpoint()
    assert latest is not None and latest.step == 1
    assert any(r.get("type") == "CHECKPOINT_CORRUPT" for r in records(attempt["run"]))


def test_an_exception_in_the_block_commits_nothing(attempt: dict[str, Path]) -> None:
    with pytest.raises(RuntimeError), script_client.checkpoint(5) as d:
        (d / "half").write_text("x")
        raise RuntimeError("disk full of opinions")
    assert list_checkpoints(attempt["ckpt"]) == []
    assert [p.name for p in attempt["ckpt"].iterdir()] == ["fence"]


def test_a_fenced_out_attempt_never_commits_and_exits_fenced(attempt: dict[str, Path]) -> None:
    with script_client.checkpoint(1) as d:
        (d / "w").write_text("mine")
    write_fence(attempt["ckpt"], 8)  # a newer attempt claimed the job
    with pytest.raises(script_client.Fenced) as info, script_client.checkpoint(2) as d:
        (d / "w").write_text("stale")
    assert info.value.code == ExitCode.FENCED
    assert [s for s, _ in list_checkpoints(attempt["ckpt"])] == [1]
    assert not [p for p in attempt["ckpt"].iterdir() if p.name.startswith(".tmp-")]
    assert (attempt["run"] / EXIT_DIR / "script-rank0").read_text() == str(int(ExitCode.FENCED))


def test_a_revoked_fence_stops_the_script_at_its_next_step_once_the_lease_is_gone(attempt: dict[str, Path]) -> None:
    revoke_fence(attempt["ckpt"], 7)  # the reconciler declared the attempt lost
    write_lease(attempt["run"] / "lease", Lease(token=7, expires=lease_clock() - 1, lease_s=600))
    with pytest.raises(script_client.Fenced) as info:
        script_client.report(1, 1.0)
    assert info.value.code == ExitCode.FENCED


# ------------------------------------------------------------------------------------------------ the example


def test_the_shipped_example_is_a_valid_script_spec() -> None:
    spec = parse_spec_text((ROOT / "examples" / "digits-script" / "job.yaml").read_text())
    assert spec.command is not None and spec.command[:2] == ["python", "train.py"] and spec.code is None


def test_submit_workdir_adds_the_code_section_a_script_spec_leaves_out() -> None:
    from cli.code import with_code

    data = with_code(SCRIPT, "job.yaml")
    assert data["code"] == {} and data["command"] == ["python", "train.py"]
