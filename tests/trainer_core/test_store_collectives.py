"""store.py without sockets: a key initialized twice, and requests that wait for a worker in a
collective call (``Store.enter``/``back``/``stuck``)."""

from __future__ import annotations

import pytest

from tests.trainer_core.test_store import ones, req
from trainer_core.ps import protocol as wire
from trainer_core.ps.store import Store, StoreError


def test_init_again_with_the_same_values_keeps_the_key_and_with_others_is_refused() -> None:
    s = Store(num_workers=2)
    s.handle(req(wire.INIT, 0, ones(1)))
    s.set_optimizer({"type": "sgd", "learning_rate": 1.0, "momentum": 0.9})
    s.handle(req(wire.PUSH, 0, ones(1)))
    s.handle(req(wire.PUSH, 1, ones(1)))  # a round: the value and the momentum change
    value = s.keys[("k", 0)].weight.copy()
    s.handle(req(wire.INIT, 0, value.copy()))  # the same values: nothing changes
    assert s.keys[("k", 0)].weight.tolist() == value.tolist() and s.keys[("k", 0)].opt_state
    with pytest.raises(StoreError, match=r"key 'k' \(part 0\) was initialized already \(4 of float32\)"):
        s.handle(req(wire.INIT, 0, ones(7)))
    assert s.keys[("k", 0)].weight.tolist() == value.tolist()


def test_a_waiting_pull_fails_when_a_worker_that_has_not_pushed_enters_a_barrier() -> None:
    s = Store(num_workers=2)
    s.handle(req(wire.INIT, 0, ones(0)))
    a = req(wire.PUSHPULL, 0, ones(1))
    assert s.handle(a) == []
    s.enter(1, "barrier()", 1)
    [(failed, reason)] = s.failed
    assert failed is a and a.failed
    assert reason.startswith(
        "worker 0 waits for key 'k' (part 0) to be pushed by worker 1 in this sync round"
    )
    assert "worker 1 is in barrier()" in reason
    assert s.keys[("k", 0)].waiting == [] and s.keys[("k", 0)].pushed == {0}  # the push stays


def test_a_pull_that_would_wait_for_a_worker_in_a_collective_call_fails_at_once() -> None:
    s = Store(num_workers=3)
    s.handle(req(wire.INIT, 0, ones(0)))
    s.enter(2, "set_optimizer()", 1)
    s.handle(req(wire.PUSH, 1, ones(1)))
    assert s.failed == []  # a push waits for nothing
    p = req(wire.PULL, 1)
    assert s.handle(p) == []
    [(failed, reason)] = s.failed
    assert (
        failed is p and "to be pushed by worker 2 in" in reason and "worker 2 is in set_optimizer()" in reason
    )


def test_a_worker_in_the_collective_call_itself_is_not_waiting() -> None:
    """Worker 0 pushed (its reply forgotten) and entered the barrier; worker 1 enters too: nothing
    fails, and after the barrier worker 1's push completes the round."""
    s = Store(num_workers=2)
    s.handle(req(wire.INIT, 0, ones(0)))
    a = req(wire.PUSHPULL, 0, ones(1))
    s.handle(a)
    s.enter(0, "barrier()", 1)
    s.enter(1, "barrier()", 1)
    assert s.failed == []
    s.back(1)  # worker 1's next request: the barrier is over for both
    assert s.away.calls == {}
    assert a in s.handle(req(wire.PUSH, 1, ones(2)))


def test_back_clears_the_call_it_left_and_earlier_ones_but_not_a_later_one() -> None:
    s = Store(num_workers=3)
    s.enter(0, "barrier()", 4)
    s.enter(1, "barrier()", 4)
    s.enter(2, "init()", 5)  # already in its next call: its notice came before worker 0's request
    s.back(0)
    assert s.away.calls == {2: ("init()", 5)}


def test_nothing_fails_in_async_mode() -> None:
    s = Store(num_workers=2)
    s.sync = False
    s.handle(req(wire.INIT, 0, ones(0)))
    s.enter(1, "barrier()", 1)
    p = req(wire.PUSHPULL, 0, ones(1))
    assert s.handle(p) == [p] and s.failed == []
