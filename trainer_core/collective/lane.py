"""What a group remembers of a synchronous allreduce's shape (``Lane``: its checks and choices,
made once, as Horovod's response cache remembers a tensor's agreed response), and the checks of
an operation's array that every kind of operation shares, and how a result is delivered."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer_core.xp import like

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


def plain(a: Any) -> bool:
    """A C-contiguous numpy array (the synchronous allreduce uses it in place)."""
    return isinstance(a, np.ndarray) and a.flags.c_contiguous


def check_out(host: Any, out: Any) -> None:
    """``out`` has ``host``'s shape and dtype (or is None), else a ValueError."""
    if out is not None and (tuple(out.shape) != host.shape or out.dtype != host.dtype):
        raise ValueError(f"out must be a {host.dtype} array of shape {host.shape}")


def deliver(host: np.ndarray, template: Any, out: Any) -> Any:
    """The result ``host`` as ``template``'s kind of array, or written into ``out``."""
    if out is None:
        return like(host, template)
    out[...] = like(host, out)
    return out
