"""store.py without sockets: sync rounds, early pushes, async updates."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_core.ps.store import Request, Store, StoreError
from trainer_core.transport import wire


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
