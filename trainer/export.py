"""``python -m trainer.export CHECKPOINT OUT``: a verified checkpoint's model weights as safetensors, with a manifest.

Run by a worker (workers/exports.py) where torch is; the API never imports torch. It reads every format the
trainer writes: ``raw`` (replicated runs), ``dcp`` (sharded FSDP2 runs, gathered into full tensors without a
process group) and the older ``torch``. Only the model's weights are exported: the optimizer state and the
trainer's extras stay in the checkpoint, which remains what a restart resumes from.

OUT gets ``model.safetensors`` (tensors named by their state-dict key, e.g. ``blocks.0.attn.qkv.weight``) and
``manifest.json`` (what the file holds and its sha256), each written to a temporary name and renamed, the manifest
last: a manifest present means the export is complete. The manifest is also printed on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
from typing import Any

import torch
from safetensors.torch import save_file

from trainer.checkpoint.raw import load_raw
from trainer.checkpoint.store import MANIFEST, sha256_file, verify

WEIGHTS = "model.safetensors"
EXPORT_MANIFEST = "manifest.json"


def model_state(checkpoint: pathlib.Path) -> dict[str, torch.Tensor]:
    """The model's state dict of a committed checkpoint, on the CPU, whatever its format."""
    fmt = json.loads((checkpoint / MANIFEST).read_text()).get("format")
    if fmt == "raw":
        state = load_raw(checkpoint)["model"]
    elif fmt == "dcp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            whole = pathlib.Path(tmp) / "state.pt"
            dcp_to_torch_save(str(checkpoint), str(whole))  # no process group: reads every shard
            state = torch.load(whole, map_location="cpu", weights_only=True)["model"]
    elif fmt == "torch":
        state = torch.load(checkpoint / "model.pt", map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"unknown checkpoint format {fmt!r}")
    return {name: t for name, t in state.items() if isinstance(t, torch.Tensor)}


def _replace(path: pathlib.Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)  # the rename itself, durable before the next file
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def export(checkpoint: pathlib.Path, out: pathlib.Path, *, job_id: int | None = None) -> dict[str, Any]:
    problem = verify(checkpoint)
    if problem is not None:
        raise ValueError(f"checkpoint {checkpoint.name} does not verify: {problem}")
    source = json.loads((checkpoint / MANIFEST).read_text())
    # Tied weights share storage; safetensors refuses shared tensors, so each name gets its own copy.
    tensors = {name: t.detach().contiguous().clone() for name, t in sorted(model_state(checkpoint).items())}
    out.mkdir(parents=True, exist_ok=True)
    metadata = {"kiln_job": str(job_id or ""), "kiln_step": str(source.get("step", "")), "format": "pt"}
    _replace(out / WEIGHTS, lambda p: save_file(tensors, str(p), metadata=metadata))
    manifest = {
        "job_id": job_id,
        "step": source.get("step"),
        "file": WEIGHTS,
        "bytes": (out / WEIGHTS).stat().st_size,
        "sha256": sha256_file(out / WEIGHTS),
        "tensors": {
            name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for name, t in tensors.items()
        },
        "parameters": sum(t.numel() for t in tensors.values()),
        "source": {
            "format": source.get("format"),
            "manifest_sha256": sha256_file(checkpoint / MANIFEST),
            "torch": source.get("torch"),
            "loss": source.get("loss"),
        },
    }
    _replace(out / EXPORT_MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=2) + "\n"))
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=pathlib.Path)
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--job", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        manifest = export(args.checkpoint, args.out, job_id=args.job)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in manifest.items() if k != "tensors"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
