"""Whether every rank holds the same model: the names, shapes and dtypes of its parameters, checked
once (``DistributedOptimizer``'s first exchange, ``broadcast_parameters``, a learner's ``declare``)
before any of them moves, so that a model that differs across ranks is an error on every rank
naming the first difference, not gradients summed into the wrong places.

Each rank allgathers a 16-byte digest of its list; where the digests differ, the lists themselves
(each rank's JSON bytes, padded to the longest), and every rank raises the same ``ModelMismatch``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: one parameter as the ranks compare it: (name, shape, dtype)
Entry = tuple[str, tuple[int, ...], str]


class ModelMismatch(ValueError):
    """The ranks' models differ (raised on every rank, naming the first difference)."""


def entries(names: Sequence[str], arrays: Sequence[Any]) -> list[Entry]:
    """The (name, shape, dtype) of each parameter (numpy, cupy or torch arrays)."""
    return [
        (str(n), tuple(int(d) for d in a.shape), str(a.dtype)) for n, a in zip(names, arrays, strict=True)
    ]


def check(what: str, mine: list[Entry], allgather: Callable[[np.ndarray], Any], size: int) -> None:
    """Raise ``ModelMismatch`` on every rank unless every rank passed the same ``mine``;
    ``allgather(uint8 array)``: every rank's arrays concatenated in rank order (ragged first axis).
    A collective: every rank calls it at the same point."""
    if size < 2:
        return
    blob = json.dumps([[n, list(s), d] for n, s, d in mine]).encode()
    digest = np.frombuffer(hashlib.blake2b(blob, digest_size=16).digest(), np.uint8)
    digests = np.asarray(allgather(digest.copy())).reshape(size, 16)
    if (digests == digests[0]).all():
        return
    lengths = np.asarray(allgather(np.array([len(blob)], np.int64))).reshape(-1)
    width = int(lengths.max())
    padded = np.zeros(width, np.uint8)
    padded[: len(blob)] = np.frombuffer(blob, np.uint8)
    rows = np.asarray(allgather(padded)).reshape(size, width)
    lists = []
    for row, n in zip(rows, lengths, strict=True):
        lists.append([(e[0], tuple(e[1]), e[2]) for e in json.loads(row[: int(n)].tobytes().decode())])
    raise ModelMismatch(f"{what}: the model differs across ranks: {first_difference(lists)}")


def first_difference(lists: list[list[Entry]]) -> str:
    """Where rank ``r``'s list ``lists[r]`` first differs from rank 0's (every rank says the same)."""
    ref = lists[0]
    for r, other in enumerate(lists[1:], 1):
        for i, (a, b) in enumerate(zip(ref, other, strict=False)):
            if a != b:
                return f"parameter {i}: rank 0 has {_show(a)}, rank {r} {_show(b)}"
        if len(ref) != len(other):
            return f"rank 0 has {len(ref)} parameters, rank {r} {len(other)}"
    return "the ranks' lists differ"


def _show(e: Entry) -> str:
    name, shape, dtype = e
    return f"{name!r} {shape} {dtype}"
