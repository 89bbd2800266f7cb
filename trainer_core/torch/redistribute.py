"""Horovod's operations that redistribute rows among the ranks: ``alltoall`` (with ``splits``
and the received splits) and ``reducescatter`` (with its ops and scale factors), each also
``_async`` and grouped, the synchronous forms differentiable with Horovod's gradients.

``alltoall`` runs as an allgather of every rank's splits and one of the tensors, each rank keeping
the rows meant for it (every rank's rows cross every link: correct, not bandwidth-optimal);
``reducescatter`` as the allreduce (``ops``: its ops, integer ``Average`` and scale factors) of
which each rank keeps its block of rows, split as Horovod splits them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .backend import Backend
from .compression import Compression
from .ops import (
    Average,
    Handle,
    Max,
    Min,
    Product,
    Sum,
    _Allgather,
    _allreduce_work,
    _backend,
    _check_factors,
    _horovod_compressor,
    _Many,
    _tensor_list,
    resolve_op,
)
from .process_sets import in_set
from .runtime import Runtime
from .tensors import as_array, as_tensor, check_dense


# -- alltoall -------------------------------------------------------------------------------------
def _splits(tensor: torch.Tensor, splits: Any, size: int) -> list[int]:
    rows = 1 if tensor.dim() == 0 else tensor.shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(
                f"alltoall without splits divides the first dimension equally: {rows} rows is not a multiple of {size} ranks"
            )
        return [rows // size] * size
    s = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    if len(s) != size or not all(isinstance(n, int) and n >= 0 for n in s):
        raise ValueError(f"alltoall's splits must be {size} non-negative integers (one per rank), not {s}")
    if sum(s) != rows:
        raise ValueError(f"alltoall's splits add up to {sum(s)}, but the tensor has {rows} rows")
    return [int(n) for n in s]


def _alltoall_work(backend: Backend, tensor: torch.Tensor, splits: Any) -> Handle:
    """Every rank's ``splits[r]`` rows for rank ``r``, exchanged through an allgather of the splits
    and one of the tensors (each rank keeps the rows meant for it): the result and the received
    splits."""
    check_dense(tensor, "alltoall's tensor")
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    size, me = backend.size, backend.rank
    mine = _splits(tensor, splits, size)
    t = tensor.detach()
    table_work = backend.allgather_async(np.array([mine], dtype=np.int64))
    data_work = backend.allgather_async(as_array(t))

    def finish(data: Any) -> tuple[torch.Tensor, list[int]]:
        table = np.asarray(table_work.wait()).reshape(size, size)
        every = as_tensor(data, t.dtype).reshape(-1, *t.shape[1:])
        pieces, at = [], 0
        for r in range(size):
            start = at + int(table[r, :me].sum())
            pieces.append(every[start : start + int(table[r, me])])
            at += int(table[r].sum())
        return torch.cat(pieces), [int(n) for n in table[:, me]]

    return Handle(data_work, finish)


def _received(splits: Any, got: list[int]) -> torch.Tensor:
    dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    return torch.tensor(got, dtype=dtype)


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> Handle:
    """Start sending ``splits[r]`` rows of ``tensor`` (in order) to each rank ``r`` (equal parts
    without ``splits``); ``synchronize`` gives the rows received, in rank order, and the received
    splits."""
    scope = in_set(process_set, "alltoall", runtime)
    inner = _alltoall_work(_backend(scope), tensor, splits)
    return Handle(inner, lambda r: (r[0], _received(splits, r[1])))


class _Alltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient goes back by the alltoall of the received splits."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, runtime: Any) -> Any:
        out, got = _alltoall_work(_backend(runtime), tensor, splits).wait()
        ctx.got, ctx.runtime = got, runtime
        received = _received(splits, got)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _dead: Any) -> Any:
        back, _ = _Alltoall.apply(grad, ctx.got, ctx.runtime)
        return back, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> Any:
    """The rows every rank sent this one (differentiable); with ``splits``, also the received
    splits (as Horovod: a pair then)."""
    scope = in_set(process_set, "alltoall", runtime)
    out, received = _Alltoall.apply(tensor, splits, scope)
    return out if splits is None else (out, received)


# -- reducescatter --------------------------------------------------------------------------------
def _reducescatter_work(backend: Backend, tensor: torch.Tensor, op: str, pre: float, post: float) -> Handle:
    """This rank's block of the reduction's first dimension (Horovod's split: the first
    ``rows % size`` ranks get one row more)."""
    check_dense(tensor, "reducescatter's tensor")
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    rows, size, me = tensor.shape[0], backend.size, backend.rank
    start = me * (rows // size) + min(me, rows % size)
    count = rows // size + (1 if me < rows % size else 0)
    inner = _allreduce_work(backend, tensor, op, pre, post)
    return Handle(inner, lambda r: r.narrow(0, start, count).clone())


def _reducescatter_op(op: str | None) -> str:
    how = resolve_op(None, op)
    if how not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"reducescatter's op must be Average, Sum, Min, Max or Product, not {op!r}")
    return how


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: str = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    *,
    runtime: Runtime | None = None,
) -> Handle:
    """Start reducing ``tensor`` and keeping this rank's block of the first dimension."""
    scope = in_set(process_set, "reducescatter", runtime)
    _check_factors(prescale_factor, postscale_factor)
    how = _reducescatter_op(op)
    return _reducescatter_work(_backend(scope), tensor, how, prescale_factor, postscale_factor)


class _Reducescatter(torch.autograd.Function):
    """Differentiable reducescatter (Horovod's gradient: the allgather of the output's gradients,
    times the size for ``Sum`` and times the scale factors)."""

    @staticmethod
    def forward(ctx: Any, op: str, pre: float, post: float, runtime: Any, *tensors: torch.Tensor) -> Any:
        ctx.args = (op, pre, post, runtime)
        backend = _backend(runtime)
        handles = [_reducescatter_work(backend, t, op, pre, post) for t in tensors]
        return tuple(h.wait() for h in handles)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op, pre, post, runtime = ctx.args
        size = _backend(runtime).size
        factor = (size if op == Sum else 1) * pre * post
        scaled_grads = [g * factor if factor != 1 else g for g in grads]
        return (None, None, None, None, *_Allgather.apply(runtime, None, *scaled_grads))


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = Compression.none,
    op: str = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    *,
    runtime: Runtime | None = None,
) -> torch.Tensor:
    """This rank's block of the reduction of ``tensor`` (differentiable)."""
    return grouped_reducescatter(
        [tensor], name, compression, op, process_set, prescale_factor, postscale_factor, runtime=runtime
    )[0]


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: str = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    *,
    runtime: Runtime | None = None,
) -> _Many:
    return _Many(
        [
            reducescatter_async(t, name, op, process_set, prescale_factor, postscale_factor, runtime=runtime)
            for t in _tensor_list(tensors, "grouped_reducescatter")
        ]
    )


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Any = Compression.none,
    op: str = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    *,
    runtime: Runtime | None = None,
) -> list[torch.Tensor]:
    """``reducescatter`` of each tensor (a list; differentiable)."""
    scope = in_set(process_set, "reducescatter", runtime)
    _check_factors(prescale_factor, postscale_factor)
    how = _reducescatter_op(op)
    comp = _horovod_compressor(compression, "reducescatter")
    ts = _tensor_list(tensors, "grouped_reducescatter")
    for t in ts:
        check_dense(t, "reducescatter's tensor")
    sent = [comp.compress(t) for t in ts]
    outs = _Reducescatter.apply(how, prescale_factor, postscale_factor, scope, *[s for s, _ in sent])
    return [comp.decompress(o, c) for o, (_, c) in zip(outs, sent, strict=True)]
