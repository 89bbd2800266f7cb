"""Collectives among a job's workers: allreduce, broadcast, allgather, reduce_scatter, barrier.

>>> group = Group(links)                    # links: this rank's point-to-point ``Links``
>>> total = group.allreduce(grad, op="mean")
>>> work = group.allreduce_async(grad)      # ... compute ...; work.wait()

The package is a stack, each layer importing only those below it (tests/test_layers.py,
``COLLECTIVE_DEPS``):

* ``primitives/``: the point-to-point interface the algorithms are written against (``links``),
  the reduction operators (``reduce``) and the shared-memory segment of a host's ranks
  (``hostsegment``, waiting on ``futex``);
* ``algorithms/``: ring, recursive doubling, trees, hierarchical and shared-memory allreduce, on
  the primitives alone;
* ``policy`` (which algorithm runs), then the other data paths: ``compressed/`` (error feedback,
  its hierarchical form, PowerSGD's low-rank factors) and ``nccl`` (device arrays);
* ``group`` (``Group``: the operations, run by ``executor``, fused by ``fusion``) on all of those;
* the ``Links`` implementations: ``fabric`` (N ranks in one process, for tests) and
  ``sockets/`` (``NetLinks``: the worker processes of a job over the node layer's channels),
  each on the primitives only;
* ``job``: ``join()`` makes the group of the job's workers from the environment, the only module
  that imports ``sockets/``. See docs/collectives.md.

As Horovod's, module-level functions run on the job's default group (``group()``: made by
``join()`` on first use, held by ``default``, a ``DefaultGroup`` that ``shutdown()`` closes):

>>> from trainer_core import collective
>>> total = collective.allreduce(grad, op="mean")
>>> collective.shutdown()                   # every worker, at the end

Each also takes ``group=``: a test may run several groups in one process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .agreement import CollectiveMismatch
from .algorithms.hierarchical import Topology
from .compressed.twostage import ErrorFeedback
from .executor import CollectiveClosed, Work
from .group import Group
from .job import JobGroup, join
from .policy import ALGORITHMS, Thresholds, choose
from .primitives.links import Ctx, Handle, LinkError, Links, PeerShutDown, PeerTimeout, SubLinks
from .primitives.reduce import BFLOAT16, OPS, ReduceSpec, bf16_to_f32, f32_to_bf16, spec_for

__all__ = [
    "ALGORITHMS",
    "BFLOAT16",
    "OPS",
    "CollectiveClosed",
    "CollectiveMismatch",
    "Ctx",
    "DefaultGroup",
    "ErrorFeedback",
    "Group",
    "Handle",
    "JobGroup",
    "LinkError",
    "Links",
    "PeerShutDown",
    "PeerTimeout",
    "ReduceSpec",
    "SubLinks",
    "Thresholds",
    "Topology",
    "Work",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_async",
    "barrier",
    "barrier_async",
    "bf16_to_f32",
    "broadcast",
    "broadcast_async",
    "choose",
    "default",
    "f32_to_bf16",
    "group",
    "join",
    "reduce_scatter",
    "reduce_scatter_async",
    "shutdown",
    "spec_for",
]


class DefaultGroup:
    """Holds one default group: made by ``factory`` (``join``) on the first ``get``; ``set``
    installs one made otherwise; ``close`` closes it, and the next ``get`` joins again."""

    def __init__(self, factory: Callable[[], Group] = join) -> None:
        self._factory = factory
        self._group: Group | None = None
        self._lock = threading.Lock()

    def get(self) -> Group:
        with self._lock:
            if self._group is None:
                self._group = self._factory()
            return self._group

    def set(self, group: Group | None) -> Group | None:
        """Install ``group`` (``None``: forget it, unclosed); the previous one is returned."""
        with self._lock:
            old, self._group = self._group, group
            return old

    def close(self) -> None:
        """Close the held group (a ``JobGroup`` leaves the job), if any."""
        old = self.set(None)
        if old is not None:
            old.close()


#: the process's default group (a convenience: everything below also takes ``group=``)
default = DefaultGroup()


def group() -> Group:
    """The job's default group, joined from the environment on first use."""
    return default.get()


def shutdown() -> None:
    """Close the default group (every worker, at the end of the job)."""
    default.close()


def _g(g: Group | None) -> Group:
    return default.get() if g is None else g


def allreduce(
    array: Any, op: str = "sum", out: Any = None, *, name: str | None = None, group: Group | None = None
) -> Any:
    """``op`` (sum, mean, max, min) of ``array`` over the group's ranks (``Group.allreduce``);
    ``name`` matches the operation across ranks (docs/collectives.md: matching)."""
    return _g(group).allreduce(array, op, out, name=name)


def allreduce_async(
    array: Any, op: str = "sum", out: Any = None, *, name: str | None = None, group: Group | None = None
) -> Work:
    return _g(group).allreduce_async(array, op, out, name=name)


def broadcast(array: Any, root: int = 0, *, name: str | None = None, group: Group | None = None) -> Any:
    """``root``'s ``array`` on every rank."""
    return _g(group).broadcast(array, root, name=name)


def broadcast_async(
    array: Any, root: int = 0, *, name: str | None = None, group: Group | None = None
) -> Work:
    return _g(group).broadcast_async(array, root, name=name)


def allgather(array: Any, *, name: str | None = None, group: Group | None = None) -> Any:
    """Every rank's ``array`` concatenated along axis 0 in rank order (ragged first axis)."""
    return _g(group).allgather(array, name=name)


def allgather_async(array: Any, *, name: str | None = None, group: Group | None = None) -> Work:
    return _g(group).allgather_async(array, name=name)


def reduce_scatter(
    array: Any, op: str = "sum", *, name: str | None = None, group: Group | None = None
) -> Any:
    """This rank's rows of the reduction of ``array``."""
    return _g(group).reduce_scatter(array, op, name=name)


def reduce_scatter_async(
    array: Any, op: str = "sum", *, name: str | None = None, group: Group | None = None
) -> Work:
    return _g(group).reduce_scatter_async(array, op, name=name)


def barrier(*, name: str | None = None, group: Group | None = None) -> None:
    """Wait until every rank of the group reached this point."""
    _g(group).barrier(name=name)


def barrier_async(*, name: str | None = None, group: Group | None = None) -> Work:
    return _g(group).barrier_async(name=name)
