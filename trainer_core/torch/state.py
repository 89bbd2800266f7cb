"""Making every worker start alike: ``broadcast_parameters`` and ``broadcast_optimizer_state``
(Horovod's), root's values written in place on every rank; and Horovod's ``broadcast_object`` and
``allgather_object``. Nothing is pickled: tensors travel as their bytes, and every other value
(hyperparameters such as Adam's ``betas``, objects) in ``objects``' safe encoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainer_core.train import samemodel

from . import objects
from .ops import allgather, broadcast, broadcast_async_
from .optimizer import _Distributed
from .runtime import Runtime, default

#: the length sent in place of an object's when the sender could not encode it
_REFUSED = -1


def broadcast_parameters(params: Any, root_rank: int = 0, *, runtime: Runtime | None = None) -> None:
    """Overwrite ``params`` (a ``state_dict()``, sorted by name as Horovod does; or ``(name,
    tensor)`` pairs such as ``named_parameters()``, or a list of tensors) with ``root_rank``'s."""
    if isinstance(params, Mapping):
        named = sorted(params.items(), key=lambda kv: kv[0])
    else:
        items = list(params)
        named = [t if isinstance(t, tuple) else (f"param.{i}", t) for i, t in enumerate(items)]
    tensors = [t for _, t in named]
    bad = [type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)]
    if bad:
        raise ValueError(
            f"broadcast_parameters takes tensors (a state_dict or named_parameters()), found {bad[:3]}"
        )
    b = (runtime or default).backend()
    if not getattr(b, "server_optimizer", False):  # (the KV path then sums nothing but gradients)
        mine = samemodel.entries([str(n) for n, _ in named], tensors)
        samemodel.check("broadcast_parameters", mine, lambda a: b.allgather_async(a).wait(), b.size)
    handles = [
        broadcast_async_(t.data if t.requires_grad else t, root_rank, runtime=runtime) for t in tensors
    ]
    for h in handles:
        h.wait()


def broadcast_object(
    obj: Any = None,
    root_rank: int = 0,
    name: str | None = None,
    process_set: Any = None,
    *,
    runtime: Runtime | None = None,
) -> Any:
    """``root_rank``'s ``obj`` on every rank (Horovod's), in ``objects``' encoding, not pickled:
    an object it cannot carry is a ``TypeError`` on the root, and a ``ValueError`` naming the root
    on the other ranks (which do not wait for it)."""
    from .process_sets import in_set

    in_set(process_set, "broadcast_object", runtime)  # (registered, and this rank is in it)
    rt = runtime or default
    data, error = b"", None
    if rt.backend().rank == root_rank:
        try:
            data = objects.encode(obj, "broadcast_object's object")
        except TypeError as e:
            error = e
    length = torch.tensor([_REFUSED if error else len(data)], dtype=torch.int64)
    n = int(broadcast(length, root_rank, process_set=process_set, runtime=rt).item())
    if error is not None:
        raise error
    if n == _REFUSED:
        raise ValueError(
            f"broadcast_object: rank {root_rank} (the root) could not encode its object (see its error)"
        )
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(n, dtype=torch.uint8)
    got = broadcast(buf, root_rank, process_set=process_set, runtime=rt)
    return obj if rt.backend().rank == root_rank else objects.decode(got.numpy().tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: Any = None, *, runtime: Runtime | None = None
) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (Horovod's), in ``objects``' encoding:
    an object a rank cannot carry is a ``TypeError`` there and a ``ValueError`` naming it on the
    others."""
    from .process_sets import in_set

    in_set(process_set, "allgather_object", runtime)  # (registered, and this rank is in it)
    rt = runtime or default
    error = None
    try:
        data = objects.encode(obj, "allgather_object's object")
    except TypeError as e:
        data, error = b"", e
    lengths = allgather(
        torch.tensor([_REFUSED if error else len(data)], dtype=torch.int64),
        process_set=process_set,
        runtime=rt,
    )
    if error is not None:
        raise error
    refused = [r for r, n in enumerate(lengths.tolist()) if n == _REFUSED]
    if refused:
        raise ValueError(
            f"allgather_object: rank(s) {refused} could not encode their objects (see their errors)"
        )
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    flat = allgather(buf, process_set=process_set, runtime=rt).numpy().tobytes()
    out, at = [], 0
    for n in lengths.tolist():
        out.append(objects.decode(flat[at : at + n]))
        at += n
    return out


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer,
    root_rank: int = 0,
    model: torch.nn.Module | None = None,
    *,
    runtime: Runtime | None = None,
) -> None:
    """Make every rank's optimizer state and hyperparameters ``root_rank``'s.

    A rank whose state is empty (a fresh optimizer) first makes it with one step on zero gradients
    (Horovod's way; sparse ones for ``SparseAdam`` and, given ``model``, for SGD on its sparse
    embeddings), its parameters restored afterwards; then every state tensor is broadcast in place,
    and every other value (``lr``, ``betas``, ``step``...) as one ``broadcast_object``. LBFGS is
    refused (as Horovod)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if any(p.requires_grad and p not in optimizer.state for p in params):
        _make_state(optimizer, [p for p in params if p.requires_grad], _sparse_params(optimizer, model))
    handles = []
    values: list[tuple[dict[Any, Any], Any, Any]] = []
    for group in optimizer.param_groups:
        values += [(group, key, group[key]) for key in sorted(group) if key != "params"]
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            for key in sorted(st, key=repr):
                value = st[key]
                if isinstance(value, torch.Tensor):
                    handles.append(broadcast_async_(value, root_rank, runtime=runtime))
                else:
                    values.append((st, key, value))
    for h in handles:
        h.wait()
    got = broadcast_object([v for _, _, v in values], root_rank, runtime=runtime)
    for (where, key, _), value in zip(values, got, strict=True):
        where[key] = value


def _sparse_params(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> set[int]:
    """The ids of the parameters whose gradients are sparse (Horovod's rule)."""
    if isinstance(optimizer, torch.optim.SparseAdam):
        return {id(p) for g in optimizer.param_groups for p in g["params"]}
    if model is None or not isinstance(optimizer, torch.optim.SGD):
        return set()
    return {
        id(p)
        for m in model.modules()
        if isinstance(m, torch.nn.Embedding) and m.sparse
        for p in m.parameters()
    }


def _make_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], sparse: set[int]) -> None:
    """The optimizer's state made by one step on zero gradients; parameters and gradients kept."""
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    try:
        for p in params:
            p.grad = torch.zeros_like(p).to_sparse() if id(p) in sparse else torch.zeros_like(p)
        if isinstance(optimizer, _Distributed):  # the user's rule alone: no exchange
            super(_Distributed, optimizer).step()  # type: ignore[misc]
        else:
            optimizer.step()
    finally:
        with torch.no_grad():
            for p, value, grad in saved:
                p.copy_(value)
                p.grad = grad
