"""The reductions each rank computes by folding every rank's gathered tensor, in rank order (so
every rank gets the same bits): Horovod's ``op=Product`` and ``op=Adasum``.

Adasum (Maleki et al., "Adaptive summation") is a reduction that adds
orthogonal gradients and averages parallel ones, so that a larger job does not need a retuned
learning rate.

Two vectors combine as ``(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b`` (a coefficient is 1 where
its vector's squared norm is below 1e-8, as Horovod's); ranks combine in Horovod's recursive
order, pairs at distance 1, then 2, then 4 (rank ``r`` with ``r ^ d``), so the job's size must be a
power of two. Every rank gathers every rank's vector and computes the same tree in float64, so
the result is bit-identical on every rank; what travels is an allgather (``size`` times a
vector's bytes per rank, where Horovod's vector-halving exchange moves about two).

In a process set the ranks are the set's (its size must be a power of two; Horovod refuses Adasum
in a set other than the global one). A rank that joined (``hvd.join``) contributes zeros in its own
place, as Horovod's joined ranks do (``ops``: the allgather says which ranks gave a row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .tensors import as_tensor

FLOOR = 1e-8  # below this squared norm a vector keeps its coefficient 1 (Horovod's rule)


def power_of_two(size: int) -> bool:
    return size >= 1 and size & (size - 1) == 0


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two float64 vectors."""
    dot = float(np.dot(a, b))
    anorm, bnorm = float(np.dot(a, a)), float(np.dot(b, b))
    acoeff = 1.0 - dot / anorm * 0.5 if anorm >= FLOOR else 1.0
    bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm >= FLOOR else 1.0
    return acoeff * a + bcoeff * b


def adasum_rows(rows: np.ndarray) -> np.ndarray:
    """The Adasum of ``rows`` (one row per rank, in rank order; a power of two of them), float64."""
    if not power_of_two(len(rows)):
        raise ValueError(f"Adasum combines a power of two of vectors, not {len(rows)}")
    level = [np.asarray(r, dtype=np.float64).ravel() for r in rows]
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def product_of(every: torch.Tensor) -> torch.Tensor:
    out = every[0].clone()
    for i in range(1, len(every)):  # rank order: the same bits everywhere
        out.mul_(every[i])
    return out


def adasum_of(every: torch.Tensor) -> torch.Tensor:
    flat = every.reshape(len(every), -1).double().numpy()
    return torch.from_numpy(adasum_rows(flat)).to(every.dtype).reshape(every.shape[1:])


def fold(how: str, got: Any, t: torch.Tensor, size: int) -> torch.Tensor:
    """``how`` (``"product"`` or ``"adasum"``) of the rows an allgather of ``t`` gave, ``got``:
    ``(rows, each rank's number of rows)``; a rank that gave none (it joined: ``hvd.join``)
    contributes zeros in its own place, as Horovod's joined ranks do."""
    rows, counts = got
    gave = [i for i, c in enumerate(counts) if c] if t.numel() else list(range(size))
    every = as_tensor(rows, t.dtype, (len(gave), *t.shape))
    if len(gave) < size:
        placed = every.new_zeros((size, *t.shape))
        placed[gave] = every
        every = placed
    return product_of(every) if how == "product" else adasum_of(every)


def check_adasum(t: torch.Tensor, size: int, members: Sequence[int] | None = None) -> None:
    """Refuse what Adasum does not combine (``members``: a process set's ranks, None: the job's)."""
    if not t.is_floating_point():
        raise ValueError(f"op=Adasum reduces floating-point tensors, not {t.dtype}")
    if not power_of_two(size):
        ranks = "this job" if members is None else f"process set {list(members)}"
        raise ValueError(
            f"op=Adasum needs a power-of-two number of ranks (ranks pair at distance 1, 2, 4, ...); "
            f"{ranks} has {size}"
        )
