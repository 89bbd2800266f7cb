"""Horovod's questions about the job and about the build, answered for trainer_core.

The job: ``cross_rank``/``cross_size`` (Horovod's: this rank among the workers with the same
``local_rank``, one per host when every host runs as many) and ``is_homogeneous`` (every host runs
as many workers), from the hosts of the workers that the backend knows.

The build: trainer_core has no MPI, Gloo, DDL or oneCCL of its own (``mpi_built``,
``gloo_built``, ``ddl_built``, ``ccl_built`` are False even under ``--launcher mpi``: mpirun only
starts the processes); ``cuda_built`` says whether cupy is usable here (trainer_core's device
path), ``rocm_built`` whether that cupy is ROCm's, ``nccl_built`` whether cupy's NCCL loads.
``start_timeline``/``stop_timeline`` write Horovod's timeline (the collectives' path).
"""

from __future__ import annotations

from trainer_core.collective.nccl import load as load_nccl
from trainer_core.xp import cupy_module

from .backend import Backend
from .runtime import Runtime, default


def hosts_of(backend: Backend) -> tuple[str, ...]:
    """The host of every rank, in rank order."""
    return tuple(backend.hosts) if backend.hosts else tuple(f"rank-{r}" for r in range(backend.size))


def cross_of(hosts: tuple[str, ...], rank: int) -> tuple[int, int]:
    """``(cross_rank, cross_size)`` of ``rank``: among the ranks with its local rank."""
    local = [sum(1 for h in hosts[:r] if h == hosts[r]) for r in range(len(hosts))]
    peers = [r for r in range(len(hosts)) if local[r] == local[rank]]
    return peers.index(rank), len(peers)


def homogeneous(hosts: tuple[str, ...]) -> bool:
    return len({hosts.count(h) for h in set(hosts)}) <= 1


def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def _hip() -> bool:
    cupy = cupy_module()
    return bool(getattr(getattr(getattr(cupy, "cuda", None), "runtime", None), "is_hip", False))


def cuda_built() -> bool:
    """Whether trainer_core's CUDA path (cupy) is usable here."""
    return cupy_module() is not None and not _hip()


def rocm_built() -> bool:
    return cupy_module() is not None and _hip()


def nccl_built() -> bool:
    """Whether cupy's NCCL loads here (trainer_core's NCCL path)."""
    return load_nccl() is not None


def start_timeline(file_path: str, mark_cycles: bool = False, *, runtime: Runtime | None = None) -> None:
    """Horovod's: write each collective operation's phases (queued, negotiated, communicated) to
    ``file_path`` as a Chrome trace, from now on (every rank calls it); rank 0 writes, as Horovod's
    coordinator does, the global set's operations and those of the process sets it is in; a set
    without rank 0 is written by its first member to a file of its own
    (``trainer_core.collective.timeline``). The collectives' path only (``-s 0``)."""
    backend = (runtime or default).backend()
    sets = getattr(backend, "sets", None)
    if sets is None:
        raise ValueError(
            f"the timeline records the collectives' operations (a job without servers, -s 0); "
            f"this worker's path is {backend.comm!r}"
        )
    sets.start_timeline(file_path, mark_cycles)


def stop_timeline(*, runtime: Runtime | None = None) -> None:
    """Horovod's: stop writing the timeline (the files are complete JSON from then on)."""
    sets = getattr((runtime or default).backend(), "sets", None)
    if sets is not None:
        sets.stop_timeline()
