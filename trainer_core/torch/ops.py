"""Horovod's tensor operations on torch tensors: ``allreduce``, ``allgather``, ``broadcast`` (each
also ``_async``, returning a ``Handle`` for ``synchronize``/``poll``, and in place with ``_``).

Every rank calls the same operations in the same order (as with Horovod). Results are fresh tensors
(the in-place forms write into the argument). ``op``: ``Average`` (default), ``Sum``, ``Min``,
``Max``; ``Adasum`` is refused. Tensors are lent to trainer_core without copies where their memory
allows (``tensors``); sparse tensors are refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .backend import Backend, Waitable
from .compression import Compression, check
from .runtime import Runtime, default
from .tensors import as_array, as_tensor, check_dense, kind_of

Average, Sum, Min, Max, Adasum = "mean", "sum", "min", "max", "adasum"
OPS = (Average, Sum, Min, Max)


def resolve_op(average: bool | None, op: str | None) -> str:
    """The reduction from Horovod's arguments (``average`` is Horovod's older spelling)."""
    if average is not None and op is not None:
        raise ValueError("give op= or average=, not both (average is the deprecated spelling of op)")
    if op is None:
        return Sum if average is False else Average
    if op == Adasum:
        raise ValueError("op=Adasum is not supported by trainer_core.torch (Average, Sum, Min, Max are)")
    if op not in OPS:
        raise ValueError(f"op must be Average, Sum, Min or Max, not {op!r}")
    return op


def _backend(runtime: Runtime | None) -> Backend:
    return (runtime or default).backend()


class Handle:
    """One started operation: ``synchronize(handle)`` (``wait()``) gives its tensor, ``poll`` says
    whether it finished."""

    def __init__(self, work: Waitable, finish: Callable[[Any], torch.Tensor]) -> None:
        self._work, self._finish = work, finish
        self._result: torch.Tensor | None = None

    def done(self) -> bool:
        return self._result is not None or self._work.done()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        if self._result is None:
            self._result = self._finish(self._work.wait(timeout))
        return self._result


def synchronize(handle: Handle) -> torch.Tensor:
    """Wait for ``handle``'s operation; its output tensor."""
    return handle.wait()


def poll(handle: Handle) -> bool:
    """Whether ``handle``'s operation finished (``synchronize`` will not wait)."""
    return handle.done()


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: str | None = None,
    *,
    runtime: Runtime | None = None,
) -> Handle:
    """Start the reduction of ``tensor`` over every rank (``name`` is accepted for Horovod's
    sake and unused: operations are matched by their order)."""
    how = resolve_op(average, op)
    comp = check(compression)
    if not hasattr(comp, "compress"):
        raise ValueError(
            "allreduce takes Compression.none or .fp16; trainer_core's compressors serve DistributedOptimizer"
        )
    check_dense(tensor, "allreduce's tensor")
    sent, ctx = comp.compress(tensor.detach())
    work = _backend(runtime).allreduce_async(as_array(sent), how, kind_of(sent))
    return Handle(work, lambda r: comp.decompress(as_tensor(r, sent.dtype, sent.shape), ctx))


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: str | None = None,
    *,
    runtime: Runtime | None = None,
) -> torch.Tensor:
    """The reduction of ``tensor`` over every rank (a fresh tensor)."""
    return allreduce_async(tensor, average, name, compression, op, runtime=runtime).wait()


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    *,
    runtime: Runtime | None = None,
) -> Handle:
    """In place: ``synchronize`` writes the reduction into ``tensor`` and returns it."""
    inner = allreduce_async(tensor, average, name, Compression.none, op, runtime=runtime)

    def finish(r: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return tensor.copy_(r)

    return Handle(inner, finish)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    *,
    runtime: Runtime | None = None,
) -> torch.Tensor:
    return allreduce_async_(tensor, average, name, op, runtime=runtime).wait()


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, *, runtime: Runtime | None = None
) -> Handle:
    """Start concatenating every rank's ``tensor`` along dimension 0, in rank order (the first
    dimension may differ between ranks; a 0-d tensor counts as one row)."""
    check_dense(tensor, "allgather's tensor")
    work = _backend(runtime).allgather_async(as_array(tensor))
    return Handle(work, lambda r: as_tensor(r, tensor.dtype))


def allgather(
    tensor: torch.Tensor, name: str | None = None, *, runtime: Runtime | None = None
) -> torch.Tensor:
    return allgather_async(tensor, name, runtime=runtime).wait()


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, *, runtime: Runtime | None = None
) -> Handle:
    """Start sending ``root_rank``'s ``tensor`` to every rank (a fresh tensor on each)."""
    check_dense(tensor, "broadcast's tensor")
    work = _backend(runtime).broadcast_async(as_array(tensor), root_rank)
    return Handle(work, lambda r: as_tensor(r, tensor.dtype, tensor.shape))


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, *, runtime: Runtime | None = None
) -> torch.Tensor:
    return broadcast_async(tensor, root_rank, name, runtime=runtime).wait()


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, *, runtime: Runtime | None = None
) -> Handle:
    """In place: ``synchronize`` writes ``root_rank``'s value into ``tensor``."""
    inner = broadcast_async(tensor, root_rank, name, runtime=runtime)

    def finish(r: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return tensor.copy_(r)

    return Handle(inner, finish)


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, *, runtime: Runtime | None = None
) -> torch.Tensor:
    return broadcast_async_(tensor, root_rank, name, runtime=runtime).wait()
