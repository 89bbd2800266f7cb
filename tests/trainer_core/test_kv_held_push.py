"""A push whose pull may follow (kv/held.py). Asked (shared memory, sync): it goes out at once as a
``pushpull`` and a pull of its keys right after it takes the replies; anything else drops them.
Held (otherwise): a pull of its keys right after it goes out with it as one ``pushpull``;
anything else sends it first; nobody calling sends it within ``HOLD_S``.

In one process on memory channels (the harness of ``test_ps_client.py``): each server's handler is
wrapped to record the data ops it receives, which shows how the calls travelled, and the values
show that MXNet's ordering holds (a pull after a push sees that push's round).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import numpy as np
import pytest

from tests.trainer_core.test_ps_client import AS_ZMQ, FRAMED, InProcessJob, job, run_workers
from trainer_core.errors import KVError
from trainer_core.kv import held
from trainer_core.kv.dist import DistKVStore
from trainer_core.kv.held import MAX_UNCLAIMED
from trainer_core.ps import protocol as wire
from trainer_core.transport.channel import Received

__all__ = ["job"]  # the fixture, used by the tests below

DATA_OPS = (wire.PUSH, wire.PULL, wire.PUSHPULL)


def record_ops(j: InProcessJob) -> list[list[tuple[int, str]]]:
    """Per server, the (rank, op) of every data message it receives, in order."""
    seen: list[list[tuple[int, str]]] = [[] for _ in j.handlers]
    for i, (poller, handle) in enumerate(j.serving):

        def rec(msg: Received, handle: Callable[[Received], None] = handle, log: list = seen[i]) -> None:
            if msg.header.op in DATA_OPS and msg.header.entries:
                log.append((msg.header.body["rank"], msg.header.op))
            handle(msg)

        j.serving[i] = (poller, rec)
    return seen


def ops_of(seen: list[list[tuple[int, str]]], rank: int) -> list[list[str]]:
    return [[op for r, op in log if r == rank] for log in seen]


# the asked path (shared-memory segments) and the held one (frames sent as private copies, as over CURVE)
SHM = {"shm": True}
COPIED = {"framed": AS_ZMQ}
HOLDING = [pytest.param(SHM, id="shm-asked"), pytest.param(COPIED, id="copied-frames-held")]
# where a test counts on a pull taking the push just before it: the default 1 ms hold is shorter
# than a thread switch on a loaded machine, and the helper would then send the push alone
UNHURRIED = 1.0


@pytest.mark.parametrize("kw", HOLDING)
def test_push_then_pull_is_one_pushpull_and_sees_that_round(job: Callable, kw: dict) -> None:
    j = job(2, 2, **kw)
    seen = record_ops(j)

    def body(kv: DistKVStore) -> list:
        kv.hold.hold_s = UNHURRIED
        kv.init("w", np.zeros(3000, np.float32))  # split over both servers
        out, hist = np.empty(3000, np.float32), []
        for step in range(4):
            g = np.full(3000, (kv.rank + 1) * 10.0**step, np.float32)
            kv.push("w", g)
            g[:] = np.nan  # the caller may reuse the array as soon as push returns
            kv.pull("w", out)
            hist.append(np.unique(out).tolist())
        return hist

    assert run_workers(j, "dist_sync", body) == [[[3.0], [30.0], [300.0], [3000.0]]] * 2
    for rank in (0, 1):
        assert ops_of(seen, rank) == [[wire.PUSHPULL] * 4] * 2


@pytest.mark.parametrize("kw", HOLDING)
def test_several_pushes_then_one_pull(job: Callable, kw: dict) -> None:
    """Held: each push sends the one held before it; the pull of other keys sends the last one
    first. Asked: every push is a pushpull, and a pull of other keys is a pull of its own. Two
    pushes of one key are two rounds, and the pull after them sees the second."""
    j = job(2, 1, **kw)
    seen = record_ops(j)

    def body(kv: DistKVStore) -> dict:
        kv.hold.hold_s = UNHURRIED
        kv.init(["a", "b"], [np.zeros(4, np.float32), np.zeros(4, np.float32)])
        r = kv.rank + 1
        kv.push("a", np.full(4, r, np.float32))
        kv.push("b", np.full(4, 10 * r, np.float32))
        ab = [kv.pull("a", np.empty(4, np.float32)).tolist(), kv.pull("b", np.empty(4, np.float32)).tolist()]
        kv.push("a", np.full(4, 100 * r, np.float32))
        kv.push("a", np.full(4, 1000 * r, np.float32))
        second = kv.pull("a", np.empty(4, np.float32)).tolist()
        kv.push(["a", "b"], [np.ones(4, np.float32), np.ones(4, np.float32)])
        both = kv.pull(["b", "a"], [np.empty(4, np.float32), np.empty(4, np.float32)])
        return {"ab": ab, "second": second, "both": [x.tolist() for x in both]}

    for res in run_workers(j, "dist_sync", body):
        assert res == {"ab": [[3.0] * 4, [30.0] * 4], "second": [3000.0] * 4, "both": [[2.0] * 4] * 2}
    P, Q, PP = wire.PUSH, wire.PULL, wire.PUSHPULL
    asked = kw is SHM
    for rank in (0, 1):
        assert ops_of(seen, rank) == [[PP, PP, Q, Q, PP, PP, PP] if asked else [P, P, Q, Q, P, PP, PP]]


def test_a_second_push_of_a_key_does_not_wait_for_the_round_of_the_first(job: Callable) -> None:
    """An asked push lends its segment to the server (read where it lies until the round's next
    push). Worker 0 pushes the key twice before worker 1 pushes at all: the second push must neither
    wait for that round (worker 1 waits for it) nor overwrite the first round's values (the server
    copies them when worker 0's next request comes)."""
    j = job(2, 1, shm=True)
    pushed_twice = threading.Event()

    def body(kv: DistKVStore) -> list:
        kv.init("w", np.zeros(4, np.float32))
        r = kv.rank + 1
        if kv.rank == 0:
            kv.push("w", np.full(4, r, np.float32))
            kv.push("w", np.full(4, 10 * r, np.float32))
            pushed_twice.set()
            return [kv.pull("w", np.empty(4, np.float32)).tolist()]
        assert pushed_twice.wait(10), "worker 0's second push waited for a round worker 1 had not pushed to"
        first = kv.pushpull("w", np.full(4, r, np.float32), np.empty(4, np.float32)).tolist()
        return [first, kv.pushpull("w", np.full(4, 10 * r, np.float32), np.empty(4, np.float32)).tolist()]

    assert run_workers(j, "dist_sync", body) == [[[30.0] * 4], [[3.0] * 4, [30.0] * 4]]


def test_unclaimed_replies_of_asked_pushes_are_bounded(job: Callable) -> None:
    """Pushes of many keys, then their pulls: at most ``MAX_UNCLAIMED`` pushes are asked before
    their replies are read (more could fill a socket's buffer while the worker reads none); the
    rest are held, and every value is right."""
    n = MAX_UNCLAIMED + 8
    j = job(2, 1, shm=True)
    seen = record_ops(j)

    def body(kv: DistKVStore) -> list:
        keys = [f"k{i}" for i in range(n)]
        kv.init(keys, [np.zeros(4, np.float32)] * n)
        for i, k in enumerate(keys):
            kv.push(k, np.full(4, (kv.rank + 1) * i, np.float32))
            assert len(kv.client.unclaimed) <= MAX_UNCLAIMED
        return [kv.pull(k, np.empty(4, np.float32))[0] for k in keys]

    assert run_workers(j, "dist_sync", body) == [[3.0 * i for i in range(n)]] * 2
    for rank in (0, 1):
        (ops,) = ops_of(seen, rank)
        pushes = ops[:n]
        assert pushes[:MAX_UNCLAIMED] == [wire.PUSHPULL] * MAX_UNCLAIMED  # no wait read a reply
        assert set(pushes[MAX_UNCLAIMED:]) == {wire.PUSH}


@pytest.mark.parametrize("kw", HOLDING)
def test_a_push_nobody_follows_is_sent_at_once_or_by_the_helper_thread(job: Callable, kw: dict) -> None:
    """Worker 0 pushes and then waits on something outside the store until worker 1 has the
    round's value: only a push sent without a further call of worker 0 lets that finish (asked: at
    once; held: by the helper thread)."""
    j = job(2, 1, **kw)
    seen = record_ops(j)
    got = threading.Event()

    def body(kv: DistKVStore) -> list:
        kv.init("w", np.zeros(4, np.float32))
        kv.push("w", np.full(4, kv.rank + 1.0, np.float32))
        if kv.rank == 0:
            assert got.wait(10), "worker 1 never got the round: the held push was not sent"
            return []
        out = kv.pull("w", np.empty(4, np.float32)).tolist()
        got.set()
        return out

    assert run_workers(j, "dist_sync", body) == [[], [3.0] * 4]
    assert ops_of(seen, 0) == [[wire.PUSHPULL if kw is SHM else wire.PUSH]]
    assert ops_of(seen, 1) == [[wire.PUSHPULL]]


def test_a_push_from_the_callers_array_is_not_held(job: Callable) -> None:
    """On a channel that sends frames from the caller's array before ``send`` returns (no copy),
    holding would let the caller change the values after push returned: such a push goes at once."""
    j = job(2, 1, framed=FRAMED)
    seen = record_ops(j)

    def body(kv: DistKVStore) -> list:
        kv.init("w", np.zeros(4, np.float32))
        kv.push("w", np.full(4, kv.rank + 1.0, np.float32))
        assert kv.hold.held is None
        return kv.pull("w", np.empty(4, np.float32)).tolist()

    assert run_workers(j, "dist_sync", body) == [[3.0] * 4] * 2
    assert ops_of(seen, 0) == [[wire.PUSH, wire.PULL]]


def refuse_next_push(j: InProcessJob) -> None:
    """The server forgets key ``w``: the next data request naming it is refused."""
    j.handlers[0].store.keys.clear()


@pytest.mark.parametrize("kw", HOLDING)
@pytest.mark.parametrize("then", ["pull", "barrier", "push", "later"])
def test_an_error_of_a_push_surfaces_at_the_latest_on_the_next_call(
    job: Callable, then: str, kw: dict
) -> None:
    """Refused by the server: raised by the pull that took it (a pushpull), by a barrier, by the next
    push when it waits for its segment (else by the wait after it), or, when it was sent (held: by
    the helper thread) and its error came while nobody called, by the next call, before that call's
    own refusal: here the worker reads neither reply until the server has answered both (the
    earliest error first); never lost."""
    j = job(1, 1, **kw)
    seen = record_ops(j)
    replied = threading.Event()  # the server has handled (and answered) a push
    pulled = threading.Event()  # ... and a pull
    poller, handle = j.serving[0]

    def answered(msg: Received) -> None:
        handle(msg)
        if msg.header.op == wire.PUSH:
            replied.set()
        elif msg.header.op == wire.PULL:
            pulled.set()

    j.serving[0] = (poller, answered)

    def body(kv: DistKVStore) -> str:
        if then == "pull":
            kv.hold.hold_s = UNHURRIED
        kv.init("w", np.zeros(4, np.float32))
        refuse_next_push(j)
        kv.push("w", np.ones(4, np.float32))
        # a push the helper sent ("later", copied frames): its own error, not the pull's (the server
        # forgot the key for both); with shm the push is asked for and goes with the pull
        sent = then == "later" and kw is not SHM
        with pytest.raises(KVError, match="server refused a push" if sent else "server refused"):
            if then == "pull":
                kv.pull("w", np.empty(4, np.float32))
            elif then == "barrier":
                kv.barrier()
            elif then == "push":
                kv.push("w", np.ones(4, np.float32))  # shm: waits for its segment, meeting the error
                kv.barrier()  # copied frames: that push waited for nothing, the next wait meets it
            else:
                while kv.hold.held is not None:
                    threading.Event().wait(held.HOLD_S)
                if sent:  # the server has answered the push: its error waits at the worker
                    assert replied.wait(10.0)
                    pump = kv.client._pump  # the worker reads the push's error and the pull's together
                    kv.client._pump = lambda: (pulled.wait(10.0), pump())
                kv.pull("w", np.empty(4, np.float32))
        if then == "push":  # the second push, if it got as far as being held, is refused too
            with contextlib.suppress(KVError):
                kv.barrier()
        return "raised"

    assert run_workers(j, "dist_sync", body) == ["raised"]
    assert ops_of(seen, 0)[0][0] == (wire.PUSHPULL if then == "pull" or kw is SHM else wire.PUSH)
