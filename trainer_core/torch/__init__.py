"""trainer_core for PyTorch, under Horovod's names: every public name of ``horovod.torch``, with
Horovod's signatures. A Horovod script runs by changing its import unless it uses what is refused at
the call (Adasum on a size that is not a power of two, process sets and ``join`` with several
workers on the parameter servers' path); docs/pytorch.md's table says, name by name, what is
the same, what differs and how, and what is not supported and why.

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

import os
import warnings
from typing import Any

from . import basics, elastic
from .basics import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from .compression import Compression, Compressor
from .ddp import HookState, comm_hook
from .ops import (
    Adasum,
    Average,
    Handle,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    join,
    poll,
    sparse_allreduce_async,
    synchronize,
)
from .optimizer import DistributedOptimizer
from .process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    register_init_sets,
    remove_process_set,
)
from .redistribute import (
    alltoall,
    alltoall_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from .runtime import Runtime, default
from .state import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "Handle",
    "HookState",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Runtime",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "comm",
    "comm_hook",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]


def init(
    comm: Any = None,
    process_sets: Any = None,
    *,
    path: str | None = None,
    stall_check_s: float | None = None,
    stall_shutdown_s: float | None = None,
) -> None:
    """Join the job (see ``runtime``): a scheduler or server process serves its role and exits.

    Horovod's ``comm`` (a list of ranks; trainer_core has no MPI communicators) is accepted when it
    means every worker, and refused clearly otherwise. ``process_sets``: Horovod's, a list of
    ``ProcessSet`` registered in order (every rank the same list), or ``"dynamic"`` (sets added and
    removed later: ``add_process_set``); on the collectives' path (``process_sets``).
    ``HOROVOD_FUSION_THRESHOLD`` and ``HOROVOD_CYCLE_TIME`` are read here, as Horovod reads them
    (``fusion``: the collectives' path fuses small allreduces with them).
    ``path``: ``"allreduce"`` or ``"ps"`` (trainer_core's: which path to reduce over; by default the
    one the job has). ``stall_check_s``: a wait for a live but late rank warns after this long, and
    again every as long (0: never; default ``TRAINER_CORE_STALL_CHECK_SECONDS``, else 60);
    ``stall_shutdown_s``: it gives up after this long (default
    ``TRAINER_CORE_STALL_SHUTDOWN_SECONDS``, else 0: never)."""
    if isinstance(comm, str):
        raise TypeError(
            f"init(comm={comm!r}): Horovod's comm is an MPI communicator or a list of ranks; "
            f"trainer_core.torch's path is init(path={comm!r})"
        )
    if comm is not None and not isinstance(comm, list | tuple):
        raise TypeError(
            f"init(comm=...) takes a list of ranks: trainer_core.torch has no MPI communicators (got {type(comm).__name__})"
        )
    backend = default.init(path, None, stall_check_s, stall_shutdown_s)
    if comm is not None and sorted(int(r) for r in comm) != list(range(backend.size)):
        raise ValueError(
            f"init(comm={list(comm)}): trainer_core.torch runs every operation among all {backend.size} "
            "workers (a subset of ranks is not supported)"
        )
    register_init_sets(process_sets)
    if os.environ.get("HOROVOD_TIMELINE") and backend.comm == "allreduce":
        mark = os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "0") not in ("", "0")
        basics.start_timeline(os.environ["HOROVOD_TIMELINE"], mark)
    elif os.environ.get("HOROVOD_TIMELINE"):
        warnings.warn(
            f"HOROVOD_TIMELINE={os.environ['HOROVOD_TIMELINE']!r} is ignored: the timeline records "
            f"the collectives' operations (-s 0), and this worker's path is {backend.comm!r}",
            stacklevel=2,
        )


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


def cross_rank() -> int:
    """This worker's rank among the workers with its ``local_rank`` (its host's index when every
    host runs as many workers)."""
    b = default.backend()
    return basics.cross_of(basics.hosts_of(b), b.rank)[0]


def cross_size() -> int:
    """How many workers have this worker's ``local_rank`` (the number of hosts, when homogeneous)."""
    b = default.backend()
    return basics.cross_of(basics.hosts_of(b), b.rank)[1]


def is_homogeneous() -> bool:
    """Whether every host runs as many workers."""
    return basics.homogeneous(basics.hosts_of(default.backend()))


def comm() -> str:
    """The path: ``"allreduce"``, ``"ps"`` or ``"solo"`` (one process, no launcher)."""
    return default.backend().comm
