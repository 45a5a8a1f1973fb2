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
from collections.abc import Iterator

import torch
import torch.distributed as dist

# What a host, a link or a device causes, whatever code was running when it happened.
INFRASTRUCTURE: tuple[type[BaseException], ...] = (
    OSError, MemoryError, torch.OutOfMemoryError, dist.DistError, torch.AcceleratorError,
)


class UserError(Exception):
    """A mistake in the job's settings or recipe; ``line`` is what the user is shown."""

    def __init__(self, what: str, cause: BaseException) -> None:
        first = (str(cause).strip().splitlines() or [""])[0]
        self.line = f"{what}: {type(cause).__name__}: {first}"[:480]
        super().__init__(self.line)


def is_collective_failure(exc: BaseException) -> bool:
    """The distributed layer failed: a peer died, hung up or timed out, or the rendezvous store went away. NCCL
    raises ``DistBackendError`` and the store ``DistNetworkError``/``DistStoreError`` (all ``DistError``); gloo (CPU)
    raises a bare ``RuntimeError`` naming its transport, e.g. ``[.../gloo/transport/tcp/pair.cc:537] Read error
    [127.0.0.1]:17841: Connection reset by peer`` when the other host's rank was killed."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and "gloo/transport" in str(exc))


def is_infrastructure(exc: BaseException) -> bool:
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
