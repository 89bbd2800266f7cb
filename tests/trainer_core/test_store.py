"""store.py without sockets: sync rounds, early pushes, async updates."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_core.ps import protocol as wire
from trainer_core.ps.request import Request
from trainer_core.ps.store import Store, StoreError


def req(op: str, rank: int, data: np.ndarray | None = None, key: wire.Key = "k") -> Request:
    n = 4
    h = wire.Header(op=op, seq=1, entries=(wire.Entry(key, 0, n, "<f4"),))
    return Request(ident=b"x", header=h, rank=rank, inputs=[data], outputs=[None])


def ones(v: float) -> np.ndarray:
    return np.full(4, v, np.float32)


def test_sync_round_sums_and_answers_waiting_pulls() -> None:
    s = Store(num_workers=2)
    s.handle(req(wire.INIT, 0, ones(0)))
    a = req(wire.PUSHPULL, 0, ones(1))
    assert s.handle(a) == []  # waits for worker 1
    early = req(wire.PUSH, 0, ones(100))
    assert s.handle(early) == []  # next round: queued
    b = req(wire.PUSHPULL, 1, ones(2))
    done = s.handle(b)
    assert a in done and b in done and early in done
    assert a.results[0].tolist() == [3.0] * 4
    p = req(wire.PULL, 1)
    assert s.handle(p) == [p] and p.results[0].tolist() == [3.0] * 4
    p0 = req(wire.PULL, 0)
    assert s.handle(p0) == []  # worker 0 pushed into the open round
    s.handle(req(wire.PUSH, 1, ones(1)))
    assert p0.results[0].tolist() == [101.0] * 4


def test_a_pull_after_a_queued_push_answers_with_that_round() -> None:
    """Worker 0 pushes twice before worker 1's first push, then pulls: it gets round 2's value."""
    s = Store(num_workers=2)
    s.handle(req(wire.INIT, 0, ones(0)))
    s.handle(req(wire.PUSH, 0, ones(1)))
    s.handle(req(wire.PUSH, 0, ones(10)))  # round 2, queued
    pull = req(wire.PULL, 0)
    assert s.handle(pull) == []  # not round 1's value: this worker's last push is in round 2
    s.handle(req(wire.PUSH, 1, ones(2)))  # round 1 ends: 3
    assert pull.remaining == 1
    done = s.handle(req(wire.PUSH, 1, ones(20)))  # round 2 ends: 30
    assert pull in done and pull.results[0].tolist() == [30.0] * 4


def test_async_applies_each_push_and_unknown_keys_fail() -> None:
    s = Store(num_workers=2)
    s.sync = False
    s.set_optimizer({"type": "sgd", "learning_rate": 1.0})
    s.handle(req(wire.INIT, 0, ones(0)))
    s.handle(req(wire.PUSH, 0, ones(1)))
    p = req(wire.PUSHPULL, 1, ones(1))
    assert s.handle(p) == [p] and p.results[0].tolist() == [-2.0] * 4
    with pytest.raises(StoreError, match="not initialized"):
        s.handle(req(wire.PULL, 0, key="other"))


def test_results_are_shared_only_when_safe() -> None:
    """Same-host sync answers point at the stored array; after an early push they are copies."""
    s = Store(num_workers=2)
    s.handle(req(wire.INIT, 0, ones(0)))
    a, b = req(wire.PUSHPULL, 0, ones(1)), req(wire.PUSHPULL, 1, ones(2))
    a.share = b.share = True
    s.handle(a)
    s.handle(b)
    assert a.shared == [True] and a.results[0] is s.keys[("k", 0)].weight
    c = req(wire.PUSHPULL, 0, ones(1))
    early = req(wire.PUSH, 0, ones(5))  # worker 0 pushes into the next round before this one ends
    c.share = True
    s.handle(c)
    s.handle(early)
    s.handle(req(wire.PUSH, 1, ones(1)))
    assert c.shared == [False] and c.results[0] is not s.keys[("k", 0)].weight
    assert c.results[0].tolist() == [2.0] * 4
    s.sync = False
    d = req(wire.PULL, 1)
    d.share = True
    s.handle(d)
    assert d.shared == [False]


def test_set_state_refuses_slots_that_are_not_value_opt_or_pull() -> None:
    s = Store(num_workers=1)
    s.set_compression({"type": "1bit"})  # pull slots are welcome now, others still not
    s.handle(req(wire.INIT, 0, ones(0)))
    e = wire.Entry("k", 0, 4, "<f4")
    for slot in ("other", "pulls/residual", "value/x"):
        with pytest.raises(StoreError, match="does not fit"):
            s.set_state((e,), [ones(1)], [slot], [])
    s.set_state((e,), [ones(0.5)], ["pull/residual"], [])
    assert s.codec.parts[("k", 0)].state_dict()["residual"].tolist() == [0.5] * 4


def lending(rank: int, data: np.ndarray, keys: tuple[wire.Key, ...] = ("k",)) -> Request:
    """A same-host pushpull: its inputs stay as they are until it is answered."""
    entries = tuple(wire.Entry(k, 0, 4, "<f4") for k in keys)
    h = wire.Header(op=wire.PUSHPULL, seq=1, entries=entries)
    return Request(b"x", h, rank, [data] * len(keys), [None] * len(keys), share=True, lends=True)


def test_a_lending_first_push_is_read_where_it_lies_when_the_second_comes() -> None:
    s = Store(num_workers=3)
    s.handle(req(wire.INIT, 0, ones(0)))
    first = ones(1)
    s.handle(lending(0, first))
    first[:] = 5  # (a worker would not: it waits for the answer) the round reads it later
    s.handle(lending(1, ones(2)))
    first[:] = 100  # read once the second push came: no longer used
    done = s.handle(lending(2, ones(3)))
    assert len(done) == 3 and done[0].results[0].tolist() == [10.0] * 4


@pytest.mark.parametrize("then", [wire.PULL, wire.PUSH])
def test_a_lending_push_is_copied_when_its_worker_sends_anything_else_first(then: str) -> None:
    """A push sent as a pushpull whose answer the worker does not wait for (``kv/held.py``): its
    worker writes the segment again once a later request is answered, so the server copies what it
    borrows before serving that request (``release``); other workers' messages leave it lent."""
    s = Store(num_workers=3)
    s.handle(req(wire.INIT, 0, ones(0)))
    s.handle(req(wire.INIT, 0, ones(0), key="j"))
    first = ones(1)
    s.handle(lending(0, first))
    s.handle(req(wire.PUSH, 1, ones(2), key="j"))  # another worker: "k" still reads ``first``
    assert s.keys[("k", 0)].lent is first
    s.release(1)  # another worker's message: "k" still reads ``first``
    assert s.keys[("k", 0)].lent is first
    later = req(then, 0, None if then == wire.PULL else ones(7), key="j")
    s.release(0)  # the server calls it for every message, before serving it
    s.handle(later)
    assert s.keys[("k", 0)].lent is None
    first[:] = 100  # the worker has the answer to ``later``: it may write its segment
    s.handle(lending(1, ones(2)))
    done = s.handle(lending(2, ones(3)))
    assert done[0].results[0].tolist() == [6.0] * 4


def test_one_worker_copies_a_lending_push_and_a_refused_request_gives_back_what_it_lent() -> None:
    one = Store(num_workers=1)
    one.handle(req(wire.INIT, 0, ones(0)))
    (done,) = one.handle(lending(0, ones(4)))
    assert done.results[0].tolist() == [4.0] * 4

    allocated: list[int] = []

    def alloc(dtype: np.dtype, n: int) -> np.ndarray:
        allocated.append(n)
        if len(allocated) == 4:  # "k" and "j" stored, "k"'s accumulator made; "j"'s fails
            raise MemoryError("no memory for the accumulator")
        return np.empty(n, dtype)

    s = Store(num_workers=2, alloc=alloc)
    s.handle(req(wire.INIT, 0, ones(0)))
    s.handle(req(wire.INIT, 0, ones(0), key="j"))
    data = ones(1)
    with pytest.raises(MemoryError):
        s.handle(lending(0, data, keys=("k", "j")))  # "k" lent its input, then "j" failed
    data[:] = 50  # the worker reuses its segment once it has the error: "k" kept a copy
    assert s.keys[("k", 0)].lent is None
    (done,) = s.handle(req(wire.PUSHPULL, 1, ones(2)))
    assert done.results[0].tolist() == [3.0] * 4
