"""The server's request handling (ps/handler.py) in one process, on in-memory channels (no sockets).

Each worker is one ``MemoryChannel`` pair: the test sends on the worker's end, hands what arrived
on the server's end to ``RequestHandler.handle`` (as the server's loop does) and reads the replies
on the worker's end. Covered: sync rounds (every pull waits for the round), early pushes queued for
the next round, async updates, a server-side optimizer, compressed pushes and pulls (2-bit and
1-bit), the same-host path (shared-memory segments in, the server's own buffers out with their
descriptors), direct landing of a push in the round's accumulator, and failures: a bad rank, bad
frames, unknown keys, frames on a headers-only channel, replays on a ``fresh_seq`` channel, a
worker that finished, and a peer that is gone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import numpy as np
import pytest

from trainer_core.compression.codec import WorkerCodec, resolve_compression
from trainer_core.compression.codec import decode as gc_decode
from trainer_core.ps import protocol as wire
from trainer_core.ps.handler import SHARED_PREFIX, RequestHandler
from trainer_core.ps.protocol import SCHEMA
from trainer_core.transport.channel import Caps, ChannelClosed, Received
from trainer_core.transport.devshm import MemBuffer, SegmentFactory, job_prefix
from trainer_core.transport.memory import MemoryChannel

LOG = logging.getLogger("test_ps_server")
JOB = "unit-ps-server"
N = 8
DIRECT = Caps(direct=True)


class Worker:
    """One worker's channel to the server under test."""

    def __init__(self, handler: RequestHandler, rank: int, caps: Caps = DIRECT) -> None:
        self.handler = handler
        self.rank = rank
        self.end, self.server_end = MemoryChannel.pair(caps, log=LOG, schema=SCHEMA)
        self.server_end.place = handler.place
        self.seq = 0

    def send(
        self,
        op: str,
        entries: tuple[wire.Entry, ...] = (),
        frames: list[np.ndarray] | None = None,
        seq: int | None = None,
        **body: object,
    ) -> int:
        """Send one request and let the server handle what arrived; returns its seq."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        h = wire.Header(
            op=op, seq=seq, src=f"worker {self.rank}", entries=entries, body={"rank": self.rank, **body}
        )
        self.end.send(h, frames or [])
        self.serve()
        return seq

    def serve(self) -> None:
        self.server_end.receive(self.handler.handle)

    def replies(self) -> list[Received]:
        got: list[Received] = []

        def keep(msg: Received) -> None:
            frames = [np.frombuffer(bytes(f.buffer), np.uint8) for f in msg.frames]
            got.append(Received(msg.header, frames, msg.reply))

        self.end.receive(keep)
        return got

    def reply(self) -> Received:
        (msg,) = self.replies()
        return msg

    def close(self) -> None:
        self.end.close()
        self.server_end.close()


def entry(key: wire.Key = "w", n: int = N, shm: str | None = None, comp: dict | None = None) -> wire.Entry:
    return wire.Entry(key, 0, n, "<f4", shm, comp)


def values(msg: Received) -> list[float]:
    assert msg.header.op == wire.REPLY, msg.header.body
    return np.asarray(msg.frames[0]).view(np.float32).tolist()


@pytest.fixture
def handler() -> Iterator[RequestHandler]:
    h = RequestHandler(num_workers=2, prefix=job_prefix(JOB), log=LOG)
    yield h
    h.close()


@pytest.fixture
def workers(handler: RequestHandler) -> Iterator[list[Worker]]:
    ws = [Worker(handler, 0), Worker(handler, 1)]
    ws[0].send(wire.INIT, (entry(),), [np.zeros(N, np.float32)])
    assert ws[0].reply().header.op == wire.REPLY
    yield ws
    for w in ws:
        w.close()


def full(v: float, n: int = N) -> np.ndarray:
    return np.full(n, v, np.float32)


def test_a_sync_round_answers_every_pull_only_when_every_worker_pushed(workers: list[Worker]) -> None:
    w0, w1 = workers
    w0.send(wire.PUSH, (entry(),), [full(1)])
    assert w0.replies() == []  # a push gets no reply
    pull0 = w0.send(wire.PULL, (entry(),))
    assert w0.replies() == []  # worker 0 pushed into the open round: its pull waits
    pull1 = w1.send(wire.PULL, (entry(),))
    early = w1.reply()  # worker 1 has not pushed: the current value at once
    assert early.header.seq == pull1 and values(early) == [0.0] * N
    both = w1.send(wire.PUSHPULL, (entry(),), [full(2)])
    (r0,), (r1,) = w0.replies(), w1.replies()
    assert (r0.header.seq, r1.header.seq) == (pull0, both)
    assert values(r0) == values(r1) == [3.0] * N


def test_an_early_push_goes_to_the_next_round_and_its_pull_waits_for_it(workers: list[Worker]) -> None:
    w0, w1 = workers
    w0.send(wire.PUSH, (entry(),), [full(1)])
    w0.send(wire.PUSH, (entry(),), [full(10)])  # round 2 before round 1 ended
    w0.send(wire.PULL, (entry(),))
    w1.send(wire.PUSH, (entry(),), [full(2)])  # round 1 ends: 3; worker 0's pull waits for round 2
    assert w0.replies() == []
    w1.send(wire.PUSHPULL, (entry(),), [full(20)])
    assert values(w0.reply()) == values(w1.reply()) == [30.0] * N


def test_async_pushes_apply_at_once(workers: list[Worker]) -> None:
    w0, w1 = workers
    w0.send(wire.SET_MODE, sync=False)
    assert w0.reply().header.op == wire.REPLY
    w0.send(wire.PUSH, (entry(),), [full(4)])
    w0.send(wire.PULL, (entry(),))
    assert values(w0.reply()) == [4.0] * N  # no optimizer: the pushed value replaces the stored one
    w1.send(wire.PUSHPULL, (entry(),), [full(-1)])
    assert values(w1.reply()) == [-1.0] * N


def test_a_server_side_optimizer_updates_with_the_round_sum(workers: list[Worker]) -> None:
    w0, w1 = workers
    w0.send(wire.SET_OPTIMIZER, spec={"type": "sgd", "learning_rate": 0.5})
    assert w0.reply().header.op == wire.REPLY
    w0.send(wire.PUSH, (entry(),), [full(1)])
    w1.send(wire.PUSHPULL, (entry(),), [full(3)])
    assert values(w1.reply()) == [-2.0] * N  # 0 - 0.5 * (1 + 3)


@pytest.mark.parametrize(
    ("params", "grads", "stored", "pulled"),
    [
        # each worker's values quantize to +t; the stored sum 1.0 is pulled as +t again
        ({"type": "2bit", "threshold": 0.5}, (0.7, 0.6), 1.0, 0.5),
        ({"type": "1bit"}, (2.0, 1.0), 3.0, 3.0),  # one block of equal values: its mean
    ],
)
def test_compressed_pushes_are_decoded_and_pulls_compressed(
    workers: list[Worker], params: dict, grads: tuple[float, float], stored: float, pulled: float
) -> None:
    w0 = workers[0]
    w0.send(wire.SET_COMPRESSION, params=params)
    assert w0.reply().header.op == wire.REPLY
    codecs = [WorkerCodec(), WorkerCodec()]
    for codec, w, g in zip(codecs, workers, grads, strict=True):
        codec.set_params(resolve_compression(params))
        payload, meta = codec.encode("w", 0, full(g))
        assert payload.nbytes < N * 4
        w.send(wire.PUSHPULL, (entry(comp=meta),), [payload])
    for w in workers:
        reply = w.reply()
        assert reply.header.op == wire.REPLY
        (meta,) = reply.header.body["c"]
        assert meta["type"] == params["type"]
        got = gc_decode(reply.frames[0], meta, N, np.float32)
        np.testing.assert_allclose(got, pulled, rtol=1e-6)
    assert w0.handler.store.keys[("w", 0)].weight.tolist() == [stored] * N


def test_a_corrupt_compressed_payload_is_refused(workers: list[Worker]) -> None:
    w0, _ = workers
    w0.send(wire.SET_COMPRESSION, params={"type": "1bit"})
    w0.reply()
    w0.send(wire.PUSHPULL, (entry(comp={"type": "1bit", "block_size": 8}),), [np.zeros(1, np.uint8)])
    reply = w0.reply()
    assert reply.header.op == wire.ERROR and "1bit" in reply.header.body["reason"]
    w0.send(wire.PUSHPULL, (entry(comp={"kind": "no type"}),), [np.zeros(4, np.uint8)])
    assert "compression metadata" in w0.reply().header.body["reason"]


@pytest.mark.parametrize(
    ("meta", "n", "reason"),
    [
        ({"type": "topk"}, N, "cannot decode a topk payload"),  # the codec raised KeyError: the server died
        ({"type": "1bit", "block_size": 8}, 1 << 34, "must be pushed to a stored part"),
        ({"type": "topk", "k": 1}, 1 << 34, "must be pushed to a stored part"),  # decoded into 64 GiB before
    ],
)
def test_a_compressed_push_the_server_cannot_decode_is_refused_before_any_allocation(
    workers: list[Worker], meta: dict, n: int, reason: str
) -> None:
    """Found while building tests/faults/test_wire_fuzz.py: metadata a codec does not expect
    (``topk`` without ``k``) raised out of the handler and ended the server's loop; a declared size
    far beyond the stored part's was decoded (allocated) before the size was checked."""
    w0, w1 = workers
    w0.send(wire.PUSHPULL, (entry(n=n, comp=meta),), [np.zeros(16, np.uint8)])
    reply = w0.reply()
    assert reply.header.op == wire.ERROR and reason in reply.header.body["reason"]
    w0.send(wire.INIT, (entry("new", comp={"type": "1bit", "block_size": 8}),), [np.zeros(16, np.uint8)])
    assert "must be pushed to a stored part" in w0.reply().header.body["reason"]
    w1.send(wire.PULL, (entry(),))
    assert values(w1.reply()) == [0.0] * N  # the server serves on, the value unchanged


@pytest.mark.parametrize(
    ("op", "entries", "frames", "body", "reason"),
    [
        (wire.PULL, (entry(),), None, {"rank": 2}, "bad worker rank 2"),
        (wire.PULL, (entry(),), None, {"rank": "0"}, "'rank' missing or not an integer"),
        (wire.PUSH, (entry(),), [np.zeros(3, np.float32)], {}, "wrong size"),
        (wire.PUSH, (entry(),), None, {}, "data frame missing"),
        (wire.PULL, (entry("nokey"),), None, {}, "was not initialized"),
        (wire.PULL, (entry(n=9),), None, {}, "9 elements"),
        (wire.PULL, (entry(shm="launchkit-another-job-w0-1-0"),), None, {}, "does not belong to this job"),
        (wire.SET_MODE, (), None, {"sync": "yes"}, "sync must be true or false"),
        (wire.SET_OPTIMIZER, (), None, {"spec": {"type": "lbfgs"}}, "lbfgs"),
        (wire.SET_COMPRESSION, (), None, {"params": {"type": "nosuchcodec"}}, "nosuchcodec"),
        (wire.BARRIER, (), None, {}, "not served by a server"),
    ],
)
def test_bad_requests_get_an_error_reply_and_change_nothing(
    workers: list[Worker], op: str, entries: tuple, frames: list | None, body: dict, reason: str
) -> None:
    w0, w1 = workers
    h = wire.Header(op=op, seq=99, src="worker 0", entries=entries, body={"rank": 0, **body})
    w0.end.send(h, frames or [])
    w0.serve()
    reply = w0.reply()
    assert reply.header.op == wire.ERROR and reply.header.seq == 99
    assert reason in reply.header.body["reason"]
    w1.send(wire.PULL, (entry(),))
    assert values(w1.reply()) == [0.0] * N  # the server serves on


def test_frames_are_never_sent_on_a_channel_that_carries_headers_only(handler: RequestHandler) -> None:
    w = Worker(handler, 0, Caps(frames=False, shared_memory=True))
    other = Worker(handler, 1)
    other.send(wire.INIT, (entry(),), [np.zeros(N, np.float32)])
    other.reply()
    w.send(wire.GET_STATE)  # its reply would carry the state's arrays
    reply = w.reply()
    assert reply.header.op == wire.ERROR and "headers only" in reply.header.body["reason"]
    w.close()
    other.close()


def test_replays_on_a_fresh_seq_channel_are_dropped(
    handler: RequestHandler, caplog: pytest.LogCaptureFixture
) -> None:
    w = Worker(handler, 0, Caps(direct=True, fresh_seq=True))
    w.send(wire.INIT, (entry(),), [np.zeros(N, np.float32)], seq=5)
    assert w.reply().header.seq == 5
    with caplog.at_level(logging.WARNING):
        w.send(wire.PULL, (entry(),), seq=5)  # the same seq again
        w.send(wire.PULL, (entry(),), seq=3)  # an older one
        w.send(wire.PULL, (entry(),), seq=6, rank=7)  # a rank out of range: dropped, not answered
    assert w.replies() == []
    assert caplog.text.count("replayed or reordered") == 2
    w.send(wire.PULL, (entry(),), seq=7)
    assert w.reply().header.seq == 7
    w.close()


def test_a_finished_worker_fails_the_rounds_that_wait_for_it(workers: list[Worker]) -> None:
    w0, w1 = workers
    pull = w0.send(wire.PUSHPULL, (entry(),), [full(1)])
    w1.send(wire.FINISH)
    assert w1.reply().header.op == wire.REPLY
    failed = w0.reply()
    assert failed.header.op == wire.ERROR and failed.header.seq == pull
    assert "worker 1 finished" in failed.header.body["reason"]
    w0.send(wire.PUSH, (entry(),), [full(1)], ack=True)
    assert "can never complete" in w0.reply().header.body["reason"]


def test_a_request_waiting_for_a_worker_in_a_collective_call_gets_an_error_marked_stuck(
    workers: list[Worker],
) -> None:
    w0, w1 = workers
    pull = w0.send(wire.PUSHPULL, (entry(),), [full(1)])
    w1.send(wire.AWAY, at="barrier()", n=1)
    assert w1.reply().header.op == wire.REPLY
    failed = w0.reply()
    assert (
        failed.header.op == wire.ERROR and failed.header.seq == pull and failed.header.body["stuck"] is True
    )
    assert "to be pushed by worker 1 in this sync round" in failed.header.body["reason"]
    w1.send(
        wire.PUSHPULL, (entry(),), [full(2)]
    )  # after the barrier: the round completes, not answered twice
    assert values(w1.reply()) == [3.0] * N and w0.replies() == []


def test_a_gone_peer_does_not_disturb_the_others(workers: list[Worker]) -> None:
    w0, w1 = workers
    w0.send(wire.PULL, (entry(),))
    w0.reply()
    w0.send(wire.PUSHPULL, (entry(),), [full(1)])  # waits for worker 1
    w0.end.close()  # worker 0 is gone before its answer
    w1.send(wire.PUSHPULL, (entry(),), [full(2)])  # the round ends; answering worker 0 fails quietly
    assert values(w1.reply()) == [3.0] * N
    with pytest.raises(ChannelClosed):
        w0.server_end.send(wire.Header(op=wire.REPLY))


def test_a_push_that_opens_a_round_lands_in_the_accumulator(workers: list[Worker]) -> None:
    w0, w1 = workers
    w0.send(wire.PUSH, (entry(),), [full(1)])
    w1.send(wire.PUSHPULL, (entry(),), [full(2)])  # round 1 done: the accumulator exists
    w1.reply()
    st = w0.handler.store.keys[("w", 0)]
    assert st.acc is not None
    h = wire.Header(op=wire.PUSH, seq=50, entries=(entry(),), body={"rank": 0})
    (dest,) = w0.handler.place(h, [N * 4])
    assert dest is not None and np.frombuffer(dest, np.uint8).ctypes.data == st.acc.ctypes.data
    w0.send(wire.PUSH, (entry(),), [full(5)])  # read straight into it by the direct channel
    h1 = wire.Header(op=wire.PUSH, seq=51, entries=(entry(),), body={"rank": 1})
    assert w0.handler.place(h1, [N * 4]) == [None]  # the round is open now: no landing
    w1.send(wire.PUSHPULL, (entry(),), [full(6)])
    assert values(w1.reply()) == [11.0] * N


def test_frames_beyond_what_the_entries_hold_close_the_channel(handler: RequestHandler) -> None:
    h = wire.Header(op=wire.PUSH, seq=1, entries=(entry(),), body={"rank": 0})
    with pytest.raises(ChannelClosed, match="declares") as err:
        handler.place(h, [N * 4 + (2 << 20)])
    assert err.value.violation


def test_same_host_workers_share_segments_and_read_the_servers_buffers() -> None:
    handler = RequestHandler(num_workers=2, prefix=job_prefix(JOB), log=LOG, shared=True)
    shm_caps = Caps(frames=False, shared_memory=True)
    ws = [Worker(handler, 0, shm_caps), Worker(handler, 1, shm_caps)]
    init = Worker(handler, 0)  # init carries frames: the framed channel
    init.send(wire.INIT, (entry(),), [np.zeros(N, np.float32)])
    init.reply()
    factories = [SegmentFactory(JOB, f"w{r}") for r in range(2)]
    segs = [f.create(N * 4) for f in factories]
    try:
        for w, seg, v in zip(ws, segs, (1.0, 2.0), strict=True):
            seg.view(np.dtype("<f4"), N)[:] = v
            w.send(wire.PUSHPULL, (entry(shm=seg.name),))
        for w in ws:
            reply = w.reply()
            (located,) = reply.header.entries
            assert located.shm is not None and located.shm.startswith(SHARED_PREFIX)
            ((ident, nbytes),) = reply.header.body["fds"]
            (fd,) = w.end.take_fds(1)
            buf = MemBuffer(nbytes, fd=fd, ident=ident)
            assert buf.view(np.dtype("<f4"), N).tolist() == [3.0] * N  # the server's value, not a copy
            buf.close()
        ws[0].send(wire.PULL, (entry(shm=segs[0].name),))
        again = ws[0].reply()
        assert again.header.entries[0].shm is not None and "fds" not in again.header.body  # sent once
        # the record is the handler's, by channel, and goes with the channel
        assert set(handler.mapped) == {w.server_end for w in ws}
        handler.channel_closed(ws[0].server_end)
        assert set(handler.mapped) == {ws[1].server_end}
        ws[0].send(wire.PULL, (entry(shm=segs[0].name),))
        resent = ws[0].reply()
        assert [i for i, _ in resent.header.body["fds"]] == [ident]
        os.close(ws[0].end.take_fds(1)[0])
    finally:
        for seg in segs:
            seg.close()
        for w in [*ws, init]:
            w.close()
        handler.close()


def test_state_round_trips_through_get_state_and_set_state(workers: list[Worker]) -> None:
    w0, w1 = workers
    w0.send(wire.PUSH, (entry(),), [full(1)])
    w1.send(wire.PUSH, (entry(),), [full(2)])
    w0.send(wire.GET_STATE)
    state = w0.reply()
    assert state.header.body["slots"] == ["value"]
    assert np.asarray(state.frames[0]).view(np.float32).tolist() == [3.0] * N
    w0.send(wire.SET_STATE, (entry(),), [full(7)], slots=["value"], scalars=[])
    assert w0.reply().header.op == wire.REPLY
    w1.send(wire.PULL, (entry(),))
    assert values(w1.reply()) == [7.0] * N
    w0.send(wire.SET_STATE, (entry(),), [full(7, 3)], slots=["value"], scalars=[])
    assert w0.reply().header.op == wire.ERROR


def test_the_handler_needs_no_transport() -> None:
    """Nothing of ZeroMQ or sockets is imported by the handler module itself."""
    import ast
    import inspect

    import trainer_core.ps.handler as mod

    tree = ast.parse(inspect.getsource(mod))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {"zmq", "socket", "select"} & names
    assert not any(
        m.startswith(("trainer_core.transport.control", "trainer_core.transport.tcp")) for m in names
    )
