"""Horovod's tensor operations on torch tensors, with Horovod's signatures: ``allreduce``,
``allgather``, ``broadcast`` and their grouped forms (each also ``_async``, returning a ``Handle``
for ``synchronize``/``poll``; ``allreduce`` and ``broadcast`` also in place, with ``_``),
``sparse_allreduce_async``, ``join`` and ``barrier`` (``redistribute``: ``alltoall`` and
``reducescatter``).

Every rank calls the same operations in the same order (as with Horovod). Results are fresh
tensors (the in-place forms write into the argument). ``op``: ``Average`` (default), ``Sum``,
``Min``, ``Max``, ``Product``, ``Adasum`` (``folded``). As Horovod's: ``Average`` of an
integer tensor is the sum times ``1/size`` truncated toward zero, ``prescale_factor`` and
``postscale_factor`` multiply before and after the reduction (integers truncated the same way),
and the synchronous operations are differentiable with Horovod's gradients. Tensors are lent to
trainer_core without copies where their memory allows (``tensors``); sparse tensors are refused
with a clear error (``sparse_allreduce_async`` takes them). A failure of the group under an
operation (a peer lost, the group closed, an elastic job's workers changed) is a
``HorovodInternalError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from trainer_core.collective import CollectiveClosed, LinkError
from trainer_core.errors import MembershipChanged

from .backend import Backend, InSet, Waitable
from .compression import Compression, check
from .folded import check_adasum, fold
from .process_sets import in_set
from .runtime import Runtime, default
from .tensors import as_array, as_tensor, check_dense, kind_of

Average, Sum, Min, Max, Product, Adasum = "mean", "sum", "min", "max", "product", "adasum"
OPS = (Average, Sum, Min, Max, Product, Adasum)


class HorovodInternalError(RuntimeError):
    """An operation failed because the group did (Horovod's name: elastic training catches it)."""


#: what a failure of the group under an operation is raised as below (a HorovodInternalError here)
GROUP_FAILURES = (LinkError, CollectiveClosed, MembershipChanged)


def resolve_op(average: bool | None, op: str | None) -> str:
    """The reduction from Horovod's arguments (``average`` is Horovod's older spelling)."""
    if average is not None and op is not None:
        raise ValueError("give op= or average=, not both (average is the deprecated spelling of op)")
    if op is None:
        return Sum if average is False else Average
    if op not in OPS:
        raise ValueError(f"op must be Average, Sum, Min, Max, Product or Adasum, not {op!r}")
    return op


def _backend(scope: Runtime | Backend | None) -> Backend:
    """The backend an operation runs on: a process set's (``process_sets.in_set``) or the runtime's."""
    return scope if isinstance(scope, Backend) else (scope or default).backend()


class Handle:
    """One started operation: ``synchronize(handle)`` (``wait()``) gives its result, ``poll`` says
    whether it finished."""

    def __init__(self, work: Waitable, finish: Callable[[Any], Any]) -> None:
        self._work, self._finish = work, finish
        self._result: Any = None
        self._finished = False

    def done(self) -> bool:
        return self._finished or self._work.done()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._finished:
            try:
                raw = self._work.wait(timeout)
            except GROUP_FAILURES as e:
                raise HorovodInternalError(f"the operation failed: {e}") from e
            self._result, self._finished = self._finish(raw), True
        return self._result


class _Many:
    """Several handles waited for as one (a grouped operation): the tuple of their results, as
    Horovod's ``synchronize`` of a grouped handle gives."""

    def __init__(self, handles: Sequence[Any]) -> None:
        self._handles = list(handles)

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        return tuple(h.wait(timeout) for h in self._handles)


def synchronize(handle: Any) -> Any:
    """Wait for ``handle``'s operation; its output (a tensor, a list for a grouped operation, or
    ``alltoall``'s pair when splits were given)."""
    return handle.wait()


def poll(handle: Any) -> bool:
    """Whether ``handle``'s operation finished (``synchronize`` will not wait)."""
    return bool(handle.done())


# -- scaling (Horovod's ScaleBuffer) ---------------------------------------------------------------
def scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t * factor`` as Horovod scales: floats in their own precision, integers computed in float64
    and truncated toward zero."""
    if factor == 1.0:
        return t
    if t.is_floating_point() or t.is_complex():
        return t * factor
    return (t.double() * factor).to(t.dtype)


def _check_factors(prescale_factor: float, postscale_factor: float) -> None:
    for what, f in (("prescale_factor", prescale_factor), ("postscale_factor", postscale_factor)):
        if isinstance(f, bool) or not isinstance(f, int | float):
            raise TypeError(f"{what} must be a number, not {type(f).__name__}")


# -- allreduce ------------------------------------------------------------------------------------
def _allreduce_work(
    backend: Backend,
    tensor: torch.Tensor,
    op: str,
    prescale: float,
    postscale: float,
    name: str | None = None,
    waits: bool = False,
) -> Handle:
    """Start the reduction of ``tensor`` (``op`` resolved); the handle gives a fresh tensor
    (``waits``: the caller waits for it at once: a synchronous operation ends a fusion cycle)."""
    check_dense(tensor, "allreduce's tensor")
    t = scaled(tensor.detach(), prescale)
    floating = t.is_floating_point()
    if op == Average and not floating:  # Horovod: the sum, scaled by 1/size (truncated)
        how, post = Sum, postscale / backend.size
    else:
        how, post = op, postscale
    if how in (Product, Adasum):  # each rank folds every rank's tensor, in rank order
        if how == Adasum:
            check_adasum(t, backend.size, getattr(backend, "members", None))
        work = backend.allgather_async(as_array(t.reshape(1, *t.shape)), name=name, counts=True)
        return Handle(work, lambda got: scaled(fold(how, got, t, backend.size), post))
    work = backend.allreduce_async(as_array(t), how, kind_of(t), name=name, waits=waits)
    return Handle(work, lambda r: scaled(as_tensor(r, t.dtype, t.shape), post))


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> Handle:
    """Start the reduction of ``tensor`` over every rank; ``synchronize`` gives a fresh tensor
    (``name``: how the ranks match it, as Horovod's; unnamed ones are matched by their order)."""
    scope = in_set(process_set, "allreduce", runtime)
    _check_factors(prescale_factor, postscale_factor)
    how = resolve_op(average, op)
    return _allreduce_work(_backend(scope), tensor, how, prescale_factor, postscale_factor, name)


class _Allreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the same allreduce of the output's gradient."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, op: str, pre: float, post: float, runtime: Any, name: Any = None
    ) -> torch.Tensor:
        ctx.args = (op, pre, post, runtime)
        return _allreduce_work(_backend(runtime), tensor, op, pre, post, name, waits=True).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, pre, post, runtime = ctx.args
        return _Allreduce.apply(grad, op, pre, post, runtime), None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> torch.Tensor:
    """The reduction of ``tensor`` over every rank (a fresh tensor; differentiable)."""
    scope = in_set(process_set, "allreduce", runtime)
    _check_factors(prescale_factor, postscale_factor)
    how = resolve_op(average, op)
    comp = _horovod_compressor(compression, "allreduce")
    check_dense(tensor, "allreduce's tensor")
    sent, cctx = comp.compress(tensor)
    out = _Allreduce.apply(sent, how, prescale_factor, postscale_factor, scope, name)
    return comp.decompress(out, cctx)


def _horovod_compressor(compression: Any, what: str) -> Any:
    comp = check(compression)
    if not hasattr(comp, "compress"):
        raise ValueError(
            f"{what} takes Compression.none or .fp16; trainer_core's compressors serve DistributedOptimizer"
        )
    return comp


def _into(tensor: torch.Tensor, inner: Any) -> Handle:
    """A handle that writes ``inner``'s result into ``tensor`` and returns it."""

    def finish(r: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return tensor.copy_(r)

    return Handle(inner, finish)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> Handle:
    """In place: ``synchronize`` writes the reduction into ``tensor`` and returns it."""
    inner = allreduce_async(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set, runtime=runtime
    )
    return _into(tensor, inner)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> torch.Tensor:
    return allreduce_async_(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set, runtime=runtime
    ).wait()


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> _Many:
    """Start the reduction of every tensor of ``tensors`` (in order); ``synchronize`` gives the
    list of results."""
    return _Many(
        [
            allreduce_async(
                t, average, name, op, prescale_factor, postscale_factor, process_set, runtime=runtime
            )
            for t in _tensor_list(tensors, "grouped_allreduce")
        ]
    )


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> list[torch.Tensor]:
    """The reductions of ``tensors`` (a list; each differentiable)."""
    ts = _tensor_list(tensors, "grouped_allreduce")
    scope = in_set(process_set, "grouped_allreduce", runtime)
    _check_factors(prescale_factor, postscale_factor)
    how = resolve_op(average, op)
    comp = _horovod_compressor(compression, "grouped_allreduce")
    for t in ts:
        check_dense(t, "grouped_allreduce's tensor")
    sent = [comp.compress(t) for t in ts]
    outs = _GroupedAllreduce.apply(how, prescale_factor, postscale_factor, scope, *[s for s, _ in sent])
    return [comp.decompress(o, c) for o, (_, c) in zip(outs, sent, strict=True)]


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: str, pre: float, post: float, runtime: Any, *tensors: torch.Tensor) -> Any:
        ctx.args = (op, pre, post, runtime)
        backend = _backend(runtime)
        last = len(tensors) - 1  # (the others queued before it: one batch)
        handles = [_allreduce_work(backend, t, op, pre, post, waits=i == last) for i, t in enumerate(tensors)]
        return tuple(h.wait() for h in handles)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op, pre, post, runtime = ctx.args
        return (None, None, None, None, *_GroupedAllreduce.apply(op, pre, post, runtime, *grads))


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> _Many:
    """In place: ``synchronize`` writes each reduction into its tensor."""
    return _Many(
        [
            allreduce_async_(
                t, average, name, op, prescale_factor, postscale_factor, process_set, runtime=runtime
            )
            for t in _tensor_list(tensors, "grouped_allreduce_")
        ]
    )


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> tuple[torch.Tensor, ...]:
    return grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set, runtime=runtime
    ).wait()


def _tensor_list(tensors: Any, what: str) -> list[torch.Tensor]:
    ts = list(tensors) if isinstance(tensors, list | tuple) else None
    if ts is None or not all(isinstance(t, torch.Tensor) for t in ts):
        raise TypeError(f"{what} takes a list of tensors, not {type(tensors).__name__}")
    return ts


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None,
    op: str | None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> Callable[[], torch.Tensor]:
    """Horovod's reduction of a sparse (COO) tensor: every rank's indices and values gathered; the
    returned function waits and gives the sparse sum (``Average``: values divided by the size)."""
    scope = in_set(process_set, "sparse_allreduce_async", runtime)
    how = resolve_op(None, op)
    if how not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async sums or averages, not {how!r}")
    if not tensor.is_sparse:
        raise ValueError(
            "sparse_allreduce_async takes a sparse COO tensor (allreduce_async takes dense ones)"
        )
    t = tensor.coalesce()
    backend = _backend(scope)
    indices = Handle(backend.allgather_async(as_array(t.indices().t().contiguous())), lambda r: r)
    values = Handle(backend.allgather_async(as_array(t.values())), lambda r: r)

    def result() -> torch.Tensor:
        v = as_tensor(values.wait(), t.dtype).reshape(-1, *t.values().shape[1:])
        i = torch.from_numpy(np.array(indices.wait())).reshape(-1, t.sparse_dim()).t()
        if how == Average:
            v = v / backend.size
        return torch.sparse_coo_tensor(i, v, t.shape)

    return result


# -- allgather ------------------------------------------------------------------------------------
def _allgather_work(backend: Backend, tensor: torch.Tensor, name: str | None = None) -> Handle:
    check_dense(tensor, "allgather's tensor")
    t = tensor.detach()
    return Handle(backend.allgather_async(as_array(t), name=name), lambda r: as_tensor(r, t.dtype))


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = None, *, runtime: Runtime | None = None
) -> Handle:
    """Start concatenating every rank's ``tensor`` along dimension 0, in rank order (the first
    dimension may differ between ranks; a 0-d tensor counts as one row)."""
    scope = in_set(process_set, "allgather", runtime)
    return _allgather_work(_backend(scope), tensor, name)


class _Allgather(torch.autograd.Function):
    """Differentiable allgather (Horovod's gradient: the average over the ranks of the output's
    gradient, this rank's rows of it)."""

    @staticmethod
    def forward(ctx: Any, runtime: Any, name: str | None, *tensors: torch.Tensor) -> Any:
        backend = _backend(runtime)
        ctx.runtime, ctx.rows = runtime, [1 if t.dim() == 0 else t.shape[0] for t in tensors]
        ctx.scalar = [t.dim() == 0 for t in tensors]
        handles = [_allgather_work(backend, t, name if len(tensors) == 1 else None) for t in tensors]
        return tuple(h.wait() for h in handles)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        backend = _backend(ctx.runtime)
        reduced = [_allreduce_work(backend, g, Average, 1.0, 1.0) for g in grads]
        counts = _allgather_work(backend, torch.tensor(ctx.rows, dtype=torch.int64)).wait()
        counts = counts.reshape(backend.size, len(grads))
        out = []
        for i, h in enumerate(reduced):
            g = h.wait()
            start = int(counts[: backend.rank, i].sum())
            mine = g.narrow(0, start, ctx.rows[i])
            out.append(mine.reshape(()) if ctx.scalar[i] else mine)
        return (None, None, *out)


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = None, *, runtime: Runtime | None = None
) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0 (differentiable)."""
    scope = in_set(process_set, "allgather", runtime)
    check_dense(tensor, "allgather's tensor")
    return _Allgather.apply(scope, name, tensor)[0]


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> _Many:
    scope = in_set(process_set, "grouped_allgather", runtime)
    backend = _backend(scope)
    return _Many([_allgather_work(backend, t) for t in _tensor_list(tensors, "grouped_allgather")])


def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> tuple[torch.Tensor, ...]:
    """``allgather`` of each tensor (a tuple, as Horovod's; differentiable)."""
    scope = in_set(process_set, "grouped_allgather", runtime)
    ts = _tensor_list(tensors, "grouped_allgather")
    for t in ts:
        check_dense(t, "grouped_allgather's tensor")
    return tuple(_Allgather.apply(scope, None, *ts))


# -- broadcast ------------------------------------------------------------------------------------
def _broadcast_work(
    backend: Backend, tensor: torch.Tensor, root_rank: int, name: str | None = None
) -> Handle:
    check_dense(tensor, "broadcast's tensor")
    t = tensor.detach()
    work = backend.broadcast_async(as_array(t), root_rank, name=name)
    return Handle(work, lambda r: as_tensor(r, t.dtype, t.shape))


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> Handle:
    """Start sending ``root_rank``'s ``tensor`` to every rank (a fresh tensor on each)."""
    scope = in_set(process_set, "broadcast", runtime)
    return _broadcast_work(_backend(scope), tensor, root_rank, name)


class _Broadcast(torch.autograd.Function):
    """Differentiable broadcast (Horovod's gradient: the average of the output's gradients on the
    root, zeros elsewhere)."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root_rank: int, runtime: Any, name: Any = None
    ) -> torch.Tensor:
        ctx.root, ctx.runtime = root_rank, runtime
        return _broadcast_work(_backend(runtime), tensor, root_rank, name).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        backend = _backend(ctx.runtime)
        g = _allreduce_work(backend, grad, Average, 1.0, 1.0, waits=True).wait()
        mine = backend.members[backend.rank] if isinstance(backend, InSet) else backend.rank
        return (g if mine == ctx.root else torch.zeros_like(g)), None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> torch.Tensor:
    """``root_rank``'s ``tensor`` (a fresh tensor; differentiable)."""
    scope = in_set(process_set, "broadcast", runtime)
    check_dense(tensor, "broadcast's tensor")
    return _Broadcast.apply(tensor, root_rank, scope, name)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> Handle:
    """In place: ``synchronize`` writes ``root_rank``'s value into ``tensor``."""
    return _into(tensor, broadcast_async(tensor, root_rank, name, process_set, runtime=runtime))


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> torch.Tensor:
    return broadcast_async_(tensor, root_rank, name, process_set, runtime=runtime).wait()


# -- join and barrier -----------------------------------------------------------------------------
def join(device: int = -1, *, runtime: Runtime | None = None) -> int:
    """Horovod's ``join``: this rank has no more data; until every rank has joined it takes part
    in the others' operations (zeros for an allreduce, no rows for an allgather:
    ``trainer_core.collective.joining``). Returns the rank that joined last, on every rank."""
    try:
        return _backend(runtime).join()
    except GROUP_FAILURES as e:
        raise HorovodInternalError(f"the operation failed: {e}") from e


def barrier(process_set: Any = None, *, runtime: Runtime | None = None) -> None:
    """Wait until every worker reached this point."""
    scope = in_set(process_set, "barrier", runtime)
    _backend(scope).barrier()
