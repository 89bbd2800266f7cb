"""What a group remembers of a synchronous allreduce's shape (``Lane``: its checks and choices,
made once, as Horovod's response cache remembers a tensor's agreed response), and the checks of
an operation's array that every kind of operation shares."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .policy import Thresholds
from .primitives.reduce import ReduceSpec

LANES = 256  # shapes whose synchronous allreduce is remembered (``Group._lane``)


@dataclass(frozen=True)
class Lane:
    """A synchronous allreduce's checks and choices for one shape, dtype, op and kind (``Group._lane``)."""

    spec: ReduceSpec
    body: bytes  # the digest of its descriptor but the name (``agreement.body``)
    nbytes: int
    shm: bool  # through the host's segment, its record shown in the first step
    split: bool
    thresholds: Thresholds  # the thresholds it was made under (others: made again)


@functools.lru_cache(maxsize=64)
def dtype_name(dtype: Any) -> str:
    return str(dtype)


def check_array(what: str, a: Any) -> None:
    """A numpy or cupy array (anything with a dtype, a shape and bytes), else a TypeError that
    says what is accepted."""
    if not all(hasattr(a, attr) for attr in ("dtype", "shape", "nbytes", "reshape")):
        raise TypeError(
            f"collective {what} takes a numpy or cupy array, not {type(a).__name__} "
            "(wrap a list or a scalar in numpy.asarray)"
        )
