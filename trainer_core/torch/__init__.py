"""trainer_core for PyTorch, under Horovod's names: a Horovod script runs by changing its import.

>>> import trainer_core.torch as hvd
>>> hvd.init()
>>> model.load_state_dict(...)  # or train from scratch
>>> opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
...                                named_parameters=model.named_parameters(),
...                                compression=hvd.Compression.fp16)
>>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
>>> hvd.broadcast_optimizer_state(opt, root_rank=0)

Launched by ``launchkit launch -n N -s 0`` the workers allreduce among themselves
(``comm="allreduce"``); with ``-s 1`` or more, through the parameter servers (``comm="ps"``,
optionally with a server-side optimizer). Without a launcher the script runs as one rank. The DDP
communication hook is ``ddp.comm_hook`` with a ``ddp.HookState``. See docs/pytorch.md.

Only this package imports torch (the ``torch`` extra: ``pip install launchkit[torch]``).
"""

from __future__ import annotations

from typing import Any

from .compression import Compression, Compressor
from .ddp import HookState, comm_hook
from .ops import (
    Adasum,
    Average,
    Handle,
    Max,
    Min,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    poll,
    synchronize,
)
from .optimizer import DistributedOptimizer
from .runtime import Runtime, default
from .state import broadcast_optimizer_state, broadcast_parameters

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "Handle",
    "HookState",
    "Max",
    "Min",
    "Runtime",
    "Sum",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "comm",
    "comm_hook",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "poll",
    "rank",
    "shutdown",
    "size",
    "synchronize",
]


def init(
    comm: str | None = None,
    stall_check_s: float | None = None,
    stall_shutdown_s: float | None = None,
    **_horovod: Any,
) -> None:
    """Join the job (see ``runtime``): a scheduler or server process serves its role and exits.
    ``stall_check_s``: a wait for a live but late rank warns after this long, and again every as
    long (0: never; default ``TRAINER_CORE_STALL_CHECK_SECONDS``, else 60); ``stall_shutdown_s``:
    it gives up after this long (default ``TRAINER_CORE_STALL_SHUTDOWN_SECONDS``, else 0: never)."""
    default.init(comm, None, stall_check_s, stall_shutdown_s)


def shutdown() -> None:
    """Leave the job (every worker, at the end)."""
    default.shutdown()


def is_initialized() -> bool:
    return default.initialized()


def rank() -> int:
    """This worker's rank among the workers."""
    return default.backend().rank


def size() -> int:
    """How many workers the job has."""
    return default.backend().size


def local_rank() -> int:
    """This worker's rank among the workers of its host."""
    return default.backend().local_rank


def local_size() -> int:
    """How many workers run on this host."""
    return default.backend().local_size


def comm() -> str:
    """The path: ``"allreduce"``, ``"ps"`` or ``"solo"`` (one process, no launcher)."""
    return default.backend().comm


def barrier() -> None:
    """Wait until every worker reached this point."""
    default.backend().barrier()
