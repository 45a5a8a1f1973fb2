"""What a SUCCEEDED job holds: its final checkpoint, verified on the durable storage, before the worker says so.

The trainer exits 0 only once its final checkpoint is committed (``trainer.checkpoint.final``), but the worker
records the job's result, so it checks for itself what the result rests on, as Slurm's controller believes a job's
state only from what it holds: the job's newest checkpoint in its durable directory is re-hashed against its
manifest, and

- a recipe's job must have it at the final step (the step its trainer's final record gives); if it does not, the
  attempt is an infrastructure failure (restarted from the last verified checkpoint), never SUCCEEDED;
- a script decides itself whether it checkpoints at its last step (``trainer.script_client``): its job's
  recorded step and loss become those of its newest verified checkpoint, the only state kiln holds for it. A
  script that never committed one keeps the progress it reported: there is no state to hold.

The check reads and hashes files, so it runs before the report's transaction, never inside it (the job's row is
locked there). The report then records the checkpoint's row if its relay was missed, and the job's step and loss
from its manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.checkpoint_files import MANIFEST, list_checkpoints, read_manifest, sha256_file, verify


@dataclass(frozen=True)
class FinalCheckpoint:
    """The verified checkpoint a SUCCEEDED job's result is read from, as a relay record (``adopt_checkpoint``)."""

    step: int
    loss: float | None
    record: dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    final: FinalCheckpoint | None  # None: nothing to take the result from (a script that never checkpointed)
    problem: str | None = None  # why the job may not be SUCCEEDED


def newest_verified(root: Path) -> tuple[FinalCheckpoint | None, str | None]:
    """The newest checkpoint under ``root`` whose files match its manifest, and why the newer ones did not."""
    skipped: list[str] = []
    for step, path in reversed(list_checkpoints(root)):
        why = verify(path)
        if why is not None:
            skipped.append(f"step {step}: {why}")
            continue
        manifest = read_manifest(path)
        loss = manifest.get("loss")
        record = {
            "kind": "checkpoint",
            "rank": 0,
            "step": step,
            "path": str(path),
            "tier": "durable",
            "loss": loss,
            "token": manifest.get("fencing_token"),
            "created": manifest.get("created"),
            "bytes": sum(int(f["bytes"]) for f in manifest["files"].values()),
            "sha256": sha256_file(path / MANIFEST),
            "verified": True,
        }
        found = FinalCheckpoint(step, float(loss) if isinstance(loss, int | float) else None, record)
        return found, "; ".join(skipped) or None
    return None, "; ".join(skipped) or None


def judge(root: Path, *, final_step: int | None) -> Verdict:
    """``final_step``: the step a recipe's job ended at (its checkpoint must be there); None for a script."""
    try:
        found, skipped = newest_verified(root)
    except OSError as exc:  # the storage itself cannot be read from this host
        return Verdict(None, f"the job's checkpoints cannot be read on durable storage: {exc}")
    if final_step is None:
        return Verdict(found)
    if found is not None and found.step == final_step:
        return Verdict(found)
    newest = f"the newest verified one is step {found.step}'s" if found is not None else "none verifies"
    return Verdict(
        found,
        f"final checkpoint not durable: step {final_step} is not verified on durable storage ({newest}"
        + (f"; skipped {skipped}" if skipped else "")
        + ")",
    )
