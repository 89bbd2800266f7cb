"""What an operation of a group is given, checked before it starts: the array (its dtype) and a
root rank. A list or a number given as the array was an AttributeError on ``dtype`` deep in the
group; a root given as ``"0"`` a TypeError on ``<=``; and a root of ``0.0`` passed the range check,
sent to rank ``1.0`` and hung until the peers' timeout (every rank must name the same root as an
int)."""

from __future__ import annotations

import operator
from typing import Any


def dtype_of(array: Any) -> Any:
    """``array``'s dtype; ``TypeError`` naming what was given when it is not an array."""
    dtype = getattr(array, "dtype", None)
    if dtype is None or not hasattr(array, "shape"):
        raise TypeError(
            f"collectives take a numpy or cupy array, got {type(array).__name__} {array!r:.60} "
            "(numpy.asarray(...) makes one)"
        )
    return dtype


def root_rank(what: str, root: Any, size: int) -> int:
    """``root`` as a rank of a group of ``size``: an int (or an integer type), 0 to size - 1."""
    try:
        rank = operator.index(root)
    except TypeError:
        raise TypeError(f"{what} must be a rank (an int), got {type(root).__name__} {root!r}") from None
    if not 0 <= rank < size:
        raise ValueError(f"{what} must be a rank of the group (0..{size - 1}), not {rank}")
    return rank
