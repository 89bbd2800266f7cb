"""The in-process fabric (trainer_core.collective.fabric) and the tag namespaces (links.Ctx)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.primitives.links import Ctx, LinkError, PeerTimeout, SubLinks


@pytest.mark.parametrize("eager", [True, False])
def test_send_and_recv_match_by_peer_and_tag(eager: bool) -> None:
    f = Fabric(2, timeout=5, eager=eager)
    a, b = f.endpoint(0), f.endpoint(1)
    got1, got2 = np.zeros(3, np.int32), np.zeros(3, np.int32)
    r2 = b.recv(0, 2, got2)  # posted before the send
    s1 = a.send(1, 1, np.array([1, 2, 3], np.int32))
    s2 = a.send(1, 2, np.array([4, 5, 6], np.int32))
    r1 = b.recv(0, 1, got1)  # posted after
    for h in (r1, r2, s1, s2):
        h.wait()
        assert h.done()
    assert got1.tolist() == [1, 2, 3] and got2.tolist() == [4, 5, 6]
    assert a.sent_bytes == 24 and a.sent_messages == 2


def test_rendezvous_send_completes_only_when_taken() -> None:
    f = Fabric(2, timeout=5, eager=False)
    sent = f.endpoint(0).send(1, 0, np.ones(4))
    assert not sent.done()
    f.endpoint(1).recv(0, 0, np.empty(4)).wait()
    sent.wait()
    assert sent.done()


def test_size_mismatch_names_the_peer() -> None:
    f = Fabric(2, timeout=5)
    f.endpoint(0).send(1, 0, np.ones(4, np.float32))
    with pytest.raises(LinkError, match=r"rank 0 sent 16 bytes to rank 1.*expected 8") as info:
        f.endpoint(1).recv(0, 0, np.empty(2, np.float32)).wait()
    assert info.value.node == "rank 0"


@pytest.mark.parametrize("eager", [True, False])
def test_silent_peer_fails_within_the_timeout_naming_it(eager: bool) -> None:
    f = Fabric(3, timeout=0.3, eager=eager)
    start = time.monotonic()
    with pytest.raises(PeerTimeout, match=r"rank 2 sent nothing to rank 0 within 0.3 s") as info:
        f.endpoint(0).recv(2, 7, np.empty(1)).wait()
    assert time.monotonic() - start < 2.0
    assert info.value.peer == 2 and info.value.node == "rank 2"
    # a late message for the withdrawn receive does not land in the old buffer
    f.endpoint(2).send(0, 7, np.ones(1))


def test_untaken_rendezvous_send_names_the_peer() -> None:
    f = Fabric(2, timeout=0.2, eager=False)
    with pytest.raises(PeerTimeout, match="rank 1 did not take a message from rank 0"):
        f.endpoint(0).send(1, 0, np.ones(1)).wait()


def _ring_step(f: Fabric, r: int, naive: bool) -> np.ndarray:
    links = f.endpoint(r)
    n = links.size
    out = np.empty(1000, np.float64)
    if naive:  # blocking-style: the send is waited on before the receive is posted
        links.send((r + 1) % n, 0, np.full(1000, float(r))).wait()
        links.recv((r - 1) % n, 0, out).wait()
    else:
        sent = links.send((r + 1) % n, 0, np.full(1000, float(r)))
        links.recv((r - 1) % n, 0, out).wait()
        sent.wait()
    return out


def test_ring_of_five_on_synchronous_links() -> None:
    """Every send blocks until taken: posting both before waiting passes, waiting on the send first
    deadlocks the ring (and fails with a timeout that names the peer)."""
    f = Fabric(5, timeout=5, eager=False)
    got = run_ranks(5, lambda r: _ring_step(f, r, naive=False))
    assert [g[0] for g in got] == [4.0, 0.0, 1.0, 2.0, 3.0]
    f = Fabric(5, timeout=0.3, eager=False)
    with pytest.raises(PeerTimeout, match="did not take a message"):
        run_ranks(5, lambda r: _ring_step(f, r, naive=True))


def test_sublinks_renumber_the_members() -> None:
    f = Fabric(4, timeout=5)
    sub1, sub3 = SubLinks(f.endpoint(1), [1, 3]), SubLinks(f.endpoint(3), [1, 3])
    assert (sub1.rank, sub3.rank, sub1.size) == (0, 1, 2)
    out = np.empty(2)
    sub1.send(1, 0, np.array([5.0, 6.0]))
    sub3.recv(0, 0, out).wait()
    assert out.tolist() == [5.0, 6.0]
    with pytest.raises(ValueError, match="not in the subgroup"):
        SubLinks(f.endpoint(0), [1, 3])


def test_tags_of_operations_and_phases_differ() -> None:
    f = Fabric(1)
    a, b = Ctx.for_op(f.endpoint(0), 1), Ctx.for_op(f.endpoint(0), 2)
    tags = {
        a.tag(0),
        b.tag(0),
        a.phase(0).tag(0),
        a.phase(1).tag(0),
        a.phase(0).phase(0).tag(0),
        a.phase(0).phase(1).tag(0),
        a.phase(0).phase(1).phase(0).tag(0),
        a.phase(0).phase(1).phase(1).tag(0),
        a.tag(1),
        a.tag(0, 1),
    }
    assert len(tags) == 10
    with pytest.raises(ValueError, match="out of the tag space"):
        a.phase(0).phase(0).phase(0).phase(0)


def test_run_ranks_reports_a_stuck_rank() -> None:
    never = threading.Event()
    with pytest.raises(TimeoutError, match=r"ranks \[1\]"):
        run_ranks(2, lambda r: never.wait(5) if r == 1 else r, timeout=0.2)
    never.set()


def test_scratch_keeps_working_buffers_between_operations() -> None:
    """The ring's and doubling's temporary arrays come from the group's ``Scratch``: the same
    memory operation after operation (no allocation, no fresh pages), grown when a larger one
    is needed."""
    from trainer_core.collective import Group, Thresholds
    from trainer_core.collective.primitives.links import Scratch

    s = Scratch()
    a = s.get("ring", np.dtype(np.float32), 100)
    b = s.get("ring", np.dtype(np.float64), 50)
    assert np.shares_memory(a, b) and a.size == 100 and b.dtype == np.float64
    c = s.get("ring", np.dtype(np.float32), 1000)
    assert c.size == 1000 and not np.shares_memory(a, c)
    fabric = Fabric(3)

    def body(r: int) -> list[int]:
        seen = []
        for algo in ("ring", "recursive_doubling"):
            with Group(fabric.endpoint(r), thresholds=Thresholds(force=algo)) as g:
                for _ in range(3):
                    assert (g.allreduce(np.ones(30_001, np.float32)) == 3).all()
                    seen.append(id(g._scratch._bufs["ring" if algo == "ring" else "doubling"]))
        return seen

    for seen in run_ranks(3, body):
        assert len(set(seen[:3])) == 1 and len(set(seen[3:])) == 1
