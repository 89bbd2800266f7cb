"""One server shard with 1000 simulated workers in one process (issue 28): the work of a request
does not grow with the workers. Counted as the Python lines the store executes per request
(``sys.settrace``), never by the clock; timed at 64-1024 workers in bench/scale_server.py."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from trainer_core.ps import protocol as ps
from trainer_core.ps.handler import RequestHandler
from trainer_core.transport import wire
from trainer_core.transport.channel import Caps, Payload, Peer, Received
from trainer_core.transport.devshm import job_prefix

LOG = logging.getLogger("test_server_scale")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False
STORE = str(Path(ps.__file__).with_name("store.py"))
PS_DIR = str(Path(ps.__file__).parent)
KEYS, SIZE = 4, 16
ENTRIES = tuple(ps.Entry(f"k{k}", 0, SIZE, "<f4") for k in range(KEYS))
GRAD = np.arange(SIZE, dtype=np.float32)


class SimWorker(Peer):
    """A worker as the server's reply target (no socket, no descriptor): keeps what it is sent."""

    caps = Caps(direct=True)

    def __init__(self, rank: int) -> None:
        self.rank, self.seq = rank, 0
        self.got: list[tuple[wire.Header, list[np.ndarray]]] = []

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        wire.encode(header)  # as a socket would
        self.got.append((header, [np.array(f, copy=True).view(np.float32) for f in frames]))

    def request(self, op: str, with_data: bool = False) -> Received:
        self.seq += 1
        h = ps.Header(
            op=op, seq=self.seq, src=f"worker {self.rank}", entries=ENTRIES, body={"rank": self.rank}
        )
        frames = [Payload(memoryview(GRAD.view(np.uint8))) for _ in ENTRIES] if with_data else []
        return Received(h, frames, self)


class StoreLines:
    """Counts the lines executed in ps/store.py (``everywhere``: in any module of ``ps``) while on."""

    def __init__(self, everywhere: bool = False) -> None:
        self.lines = 0
        self.everywhere = everywhere

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        return self._local if name == STORE or (self.everywhere and name.startswith(PS_DIR)) else None

    def __enter__(self) -> StoreLines:
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


def ahead(n: int) -> tuple[float, list[SimWorker]]:
    """Every worker but the last pushes twice (the second push queued for the next round), then
    pulls; then the last one does, which ends both rounds. Returns the store's lines per request."""
    handler = RequestHandler(n, job_prefix("unit-server-scale"), LOG)
    workers = [SimWorker(r) for r in range(n)]
    handler.handle(workers[0].request(ps.INIT, with_data=True))
    with StoreLines() as counted:
        for w in workers:
            handler.handle(w.request(ps.PUSH, with_data=True))
            handler.handle(w.request(ps.PUSH, with_data=True))
            handler.handle(w.request(ps.PULL))
    handler.close()
    return counted.lines / (3 * n), workers


def test_pulls_behind_queued_pushes_cost_the_same_at_1000_workers_as_at_50() -> None:
    """Failed on the old code: a pull asked whether its worker had a push queued for the next round
    by scanning that key's queue (every other worker's early push): 1.4 store lines per worker per
    request, 1500 a request at 1000 workers against 240 at 50."""
    small, _ = ahead(50)
    large, workers = ahead(1000)
    assert large < 1.2 * small, (small, large)
    for w in workers:  # each pull answered once, after both rounds: the sum of 1000 pushes
        ((h, frames),) = [(h, f) for h, f in w.got if w.rank or h.seq > 1]
        assert h.op == ps.REPLY and h.seq == w.seq and len(frames) == KEYS
        np.testing.assert_array_equal(frames[0], 1000 * GRAD)


def round_lines(n: int) -> float:
    """The lines of ``trainer_core/ps`` a sync round's requests execute (every worker pushes, then
    pulls; the second round, once the values are made), per request."""
    handler = RequestHandler(n, job_prefix("unit-server-scale"), LOG)
    workers = [SimWorker(r) for r in range(n)]
    handler.handle(workers[0].request(ps.INIT, with_data=True))
    for counting in (False, True):
        with StoreLines(everywhere=True) if counting else contextlib.nullcontext() as counted:
            for w in workers:
                handler.handle(w.request(ps.PUSH, with_data=True))
                handler.handle(w.request(ps.PULL))
    handler.close()
    assert counted is not None
    return counted.lines / (2 * n)


def test_a_sync_rounds_requests_cost_the_same_few_lines_at_1000_workers_as_at_8() -> None:
    """A push or a pull of 4 keys: 235 lines of the server's code per request before (each entry's
    key looked up twice, ``Away.__bool__`` called twice per request), 218-221 now."""
    small, large = round_lines(8), round_lines(1000)
    assert large <= small <= 225, (small, large)
