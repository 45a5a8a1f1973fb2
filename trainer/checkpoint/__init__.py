"""Asynchronous, atomic, verified checkpoints.

Layout under the job's checkpoint directory (``KILN_CHECKPOINT_DIR``, shared by all its attempts)::

    step_00000040/manifest.json   {"step", "files": {name: {"bytes", "sha256"}}, "fencing_token", ...}
    step_00000040/data_K.bin, tensors.json, tree.pt, extra.pt
                                                          (replicated state, DDP or one process: "raw")
    step_00000040/model.pt, optim.pt, extra.pt            (replicated state of older attempts: "torch")
    step_00000040/*.distcp, .metadata, extra.pt           (sharded FSDP2 state through DCP)
    step_00000040/...                                     (a script's own files: "script", trainer.script_client)
    fence                                                 (the current fencing token: written by the worker,
                                                           revoked by the reconciler when it declares an attempt lost)

Saving: state is staged into reusable CPU buffers (pinned on CUDA, copied on a side stream so the next
step's forward overlaps the copy), then a background thread writes ``.tmp-step_N-*``, fsyncs every file,
writes the manifest with a sha256 per file and renames the directory into place - but only while this
attempt's lease is valid and the fence file still names its token (``core.fence``).  Loading takes the
newest directory whose manifest verifies; corrupt ones are skipped with an event.

One module per layer, each documenting its own:

- ``store``: the directory format and its integrity - commit under the fence, manifest, verify, list, remove.
  It imports no torch: a script's client (``trainer.script_client``) commits through it too.
- ``raw``: the "raw" format of replicated state - staging buffers, data files hashed as written, ``load_raw``.
- ``checkpointer``: ``Checkpointer`` - asynchronous saves, rollback's deletion; made of the two pieces below.
- ``persist``: the copy of local-tier checkpoints to the durable tier, in a thread, and pruning.
- ``resume``: verify ahead, choose the newest checkpoint that verifies across tiers, load it.
- ``tiers``: the durable and the local tier, and which one a path is in.

``raw``, ``checkpointer``, ``persist`` and ``resume`` (torch) load on first use of one of their names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainer.checkpoint.store import (
    EXTRA,
    MANIFEST,
    PREFIX,
    FencedError,
    list_checkpoints,
    remove_checkpoint,
    sha256_file,
    step_dir_name,
    verify,
    write_manifest_and_commit,
)

if TYPE_CHECKING:
    from trainer.checkpoint.checkpointer import Checkpointer
    from trainer.checkpoint.raw import ALIGN, CHUNK, TENSORS, TREE, load_raw, writer_count
    from trainer.checkpoint.tiers import DURABLE, LOCAL

_LAZY = {
    "DURABLE": "tiers",
    "LOCAL": "tiers",
    "Checkpointer": "checkpointer",
    "ALIGN": "raw",
    "CHUNK": "raw",
    "TENSORS": "raw",
    "TREE": "raw",
    "load_raw": "raw",
    "writer_count": "raw",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "ALIGN",
    "CHUNK",
    "DURABLE",
    "EXTRA",
    "LOCAL",
    "MANIFEST",
    "PREFIX",
    "TENSORS",
    "TREE",
    "Checkpointer",
    "FencedError",
    "list_checkpoints",
    "load_raw",
    "remove_checkpoint",
    "sha256_file",
    "step_dir_name",
    "verify",
    "write_manifest_and_commit",
    "writer_count",
]
