"""Making every worker start alike: ``broadcast_parameters`` and ``broadcast_optimizer_state``
(Horovod's), root's values written in place on every rank. Nothing is pickled: tensors travel as
their bytes, numbers as float64 tensors, and other values (strings, ``None``) stay as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from trainer_core.train import samemodel

from .ops import broadcast_async_
from .optimizer import _Distributed
from .runtime import Runtime, default


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


def _numbers(values: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    return [(k, v) for k, v in values if isinstance(v, bool | int | float)]


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int = 0, *, runtime: Runtime | None = None
) -> None:
    """Make every rank's optimizer state and hyperparameters ``root_rank``'s.

    A rank whose state is empty (a fresh optimizer) first makes it with one step on zero gradients
    (Horovod's way), its parameters restored afterwards; then every state tensor and every number
    (``lr``, ``momentum``, ``step``...) is broadcast. LBFGS is refused (as Horovod)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if any(p.requires_grad and p not in optimizer.state for p in params):
        _make_state(optimizer, [p for p in params if p.requires_grad])
    handles = []
    scalars: list[tuple[dict[str, Any], str, Any, torch.Tensor]] = []
    for group in optimizer.param_groups:
        for key, value in sorted(_numbers(group.items())):
            scalars.append((group, key, type(value), torch.tensor(float(value), dtype=torch.float64)))
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            for key in sorted(st):
                value = st[key]
                if isinstance(value, torch.Tensor):
                    handles.append(broadcast_async_(value, root_rank, runtime=runtime))
                elif isinstance(value, bool | int | float):
                    scalars.append((st, key, type(value), torch.tensor(float(value), dtype=torch.float64)))
    handles += [broadcast_async_(t, root_rank, runtime=runtime) for _, _, _, t in scalars]
    for h in handles:
        h.wait()
    for where, key, kind, t in scalars:
        where[key] = kind(t.item())


def _make_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """The optimizer's state made by one step on zero gradients; parameters and gradients kept."""
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        if isinstance(optimizer, _Distributed):  # the user's rule alone: no exchange
            super(_Distributed, optimizer).step()  # type: ignore[misc]
        else:
            optimizer.step()
    finally:
        with torch.no_grad():
            for p, value, grad in saved:
                p.copy_(value)
                p.grad = grad
