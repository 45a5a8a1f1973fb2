"""Who caused a failure: the user's settings and recipe, or the machine under them.

Turning a spec into a run - reading the hyperparameters, loading the recipe, building the model and the data,
the first forward on the first batch - depends on nothing but the spec and the recipe's code: an exception
there fails again the same way on any host, so restarting it as an infrastructure failure only burns the
contract's restarts. ``user_code`` turns such an exception into a ``UserError`` (-> ``ExitCode.USER_ERROR``:
the job FAILS at once, with the user's own exception line as its reason), except the failures a host, a link
or a device causes, which stay what they are and are restarted: I/O errors, running out of host or device
memory, collective (NCCL/gloo) errors and accelerator errors.

Past that point (the training loop) an unexpected exception is still a crash and is restarted: a step that
ran once is far likelier to fail because of the machine than because of the spec.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import traceback
from collections.abc import Iterator

import torch
import torch.distributed as dist

from core.trainer_protocol import ENV_DATASETS

# What a host, a link or a device causes, whatever code was running when it happened.
INFRASTRUCTURE: tuple[type[BaseException], ...] = (
    OSError,
    MemoryError,
    torch.OutOfMemoryError,
    dist.DistError,
    torch.AcceleratorError,
)


# Directories of the team's own code (``trainer.user_recipe``): a failure's reason names its deepest frame there,
# the user's own file and line, and none of kiln's or torch's frames.
USER_CODE_ROOTS: list[str] = []


def user_frame(exc: BaseException) -> str | None:
    """``file.py:LINE`` of the deepest frame of ``exc``'s traceback inside the team's code, if any."""
    roots = [os.path.join(os.path.realpath(r), "") for r in USER_CODE_ROOTS]
    if not roots:
        return None
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.realpath(frame.filename)
        for root in roots:
            if path.startswith(root):
                where = f"{os.path.relpath(path, root)}:{frame.lineno}"
    return where


class UserError(Exception):
    """A mistake in the job's settings or recipe; ``line`` is what the user is shown."""

    def __init__(self, what: str, cause: BaseException) -> None:
        first = (str(cause).strip().splitlines() or [""])[0]
        where = user_frame(cause)
        self.line = f"{what}: {type(cause).__name__}: {first}"[:440] + (f" ({where})" if where else "")
        super().__init__(self.line)


def is_collective_failure(exc: BaseException) -> bool:
    """The distributed layer failed: a peer died, hung up or timed out, or the rendezvous store went away. NCCL
    raises ``DistBackendError`` and the store ``DistNetworkError``/``DistStoreError`` (all ``DistError``); gloo (CPU)
    raises a bare ``RuntimeError`` naming its transport, e.g. ``[.../gloo/transport/tcp/pair.cc:537] Read error
    [127.0.0.1]:17841: Connection reset by peer`` when the other host's rank was killed."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and "gloo/transport" in str(exc))


# Among OSErrors, a path the job may not touch (its own user is denied: workers/attempt_user.py) or that does not
# exist is the job's own doing, the same on every host.
THE_JOBS_OWN: tuple[type[BaseException], ...] = (
    PermissionError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    FileExistsError,
)


def writes_a_dataset(exc: BaseException) -> bool:
    """A write into one of the job's datasets, which the worker mounts read-only (EROFS): the job's own doing. A
    read-only file system anywhere else (a disk the kernel remounted read-only after errors) is the host's."""
    if not isinstance(exc, OSError) or exc.errno != errno.EROFS or not exc.filename:
        return False
    try:
        mounts = [
            os.path.join(os.path.realpath(p), "") for p in json.loads(os.environ.get(ENV_DATASETS) or "{}").values()
        ]
    except (ValueError, AttributeError, TypeError):
        return False
    path = os.path.realpath(os.fsdecode(exc.filename))
    return any(os.path.join(path, "").startswith(m) for m in mounts)


def is_infrastructure(exc: BaseException) -> bool:
    if isinstance(exc, THE_JOBS_OWN) or writes_a_dataset(exc):
        return False
    return isinstance(exc, INFRASTRUCTURE) or is_collective_failure(exc)


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run one step of turning the user's settings into a run; ``what`` names it in the reason."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        if is_infrastructure(exc):
            raise
        raise UserError(what, exc) from exc
