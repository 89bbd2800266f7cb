"""Sync rounds of an elastic job: each worker's push kept apart until the round closes (pure).

In a job that is not elastic a round sums the pushes as they arrive (``store.Store``). In an
elastic job a worker may leave mid-round; its push must then be taken out of that round, which a
running sum cannot do exactly. So the round keeps each worker's push (a copy, by the worker's
stable id), closes when every *member of the current epoch* has pushed (a worker that joined after the start
counts in a key's rounds from its first push to that key), and sums the pushes then,
in id order (the same order on every server, whatever the order of arrival). A worker that
leaves is taken out of every open round: its push and its waiting requests are dropped, and a
round that the remaining members have all pushed to closes at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from trainer_core.ps.request import KeyState


def keep(st: KeyState, worker: int, data: np.ndarray) -> None:
    """Worker ``worker``'s push to the open round of ``st`` (copied: its buffer is reused)."""
    st.parts[worker] = np.array(data, copy=True)


def total(st: KeyState, alloc: Callable[[np.dtype, int], np.ndarray]) -> np.ndarray:
    """The sum of the round's pushes, in worker order, into ``st.acc`` (made when missing); the
    round's pushes are forgotten."""
    if st.acc is None:
        st.acc = alloc(st.weight.dtype, st.weight.size)
    order = sorted(st.parts)
    np.copyto(st.acc, st.parts[order[0]])
    for w in order[1:]:
        np.add(st.acc, st.parts[w], out=st.acc)
    st.parts.clear()
    return st.acc


def drop(states: Iterable[KeyState], left: set[int], expected: Callable[[KeyState], int]) -> list[KeyState]:
    """Take the workers ``left`` out of every open round of ``states``: their pushes, queued pushes
    and waiting requests; returns the states whose round is complete now (``expected(st)``
    pushed)."""
    complete: list[KeyState] = []
    for st in states:
        if not (left & (st.pushed | st.queued)) and not any(
            req.rank in left for req, _ in st.waiting + st.deferred
        ):
            if st.pushed and len(st.pushed) >= expected(st):
                complete.append(st)
            continue
        for w in left:
            st.parts.pop(w, None)
        st.pushed -= left
        st.queued -= left
        st.waiting = [(req, i) for req, i in st.waiting if req.rank not in left]
        st.deferred = [(req, i) for req, i in st.deferred if req.rank not in left]
        if st.pushed and len(st.pushed) >= expected(st):
            complete.append(st)
    return complete
