"""How the ranks of one group show each other their operations' records and queues
(``Exchange``), for the negotiator (``negotiator.py``) and the speculative allreduce
(``speculation.py``).

The records travel through the host's shared-memory segment where every rank is on one host
(beside each rank's counter, in the header line, bytes 8..40; one step of every rank's counter
per slot: ``show``, then ``records_at``), else through rank 0 over the links (two small messages:
a rank's record to rank 0, rank 0's table of every record back), on the operation's control tag.
The queues, on the slow path only, go from every rank to every other.
"""

from __future__ import annotations

import numpy as np

from .agreement import RECORD_BYTES, record_nbytes
from .primitives.hostsegment import LINE, Local
from .primitives.links import Ctx, Links, wait_all

_WORDS = RECORD_BYTES // 4
_SLOW = 0, 1, 2  # segments of the control step: record, every rank's records, a queue's length/bytes


def control_bytes(rank: int, size: int) -> int:
    """The bytes ``rank`` sends over the links to agree on one operation whose records match (where
    the records do not travel through a host's segment): its record to rank 0, or rank 0's table
    of every record to each other rank."""
    if size < 2:
        return 0
    return (size - 1) * size * RECORD_BYTES if rank == 0 else RECORD_BYTES


class Exchange:
    """How the ranks of one group show each other their records and queues."""

    def __init__(self, links: Links, local: Local | None) -> None:
        self.links = links
        #: the segment, where it holds every rank of the group
        self.local = local if local is not None and local.size == links.size else None

    def put(self, rec: bytes) -> None:
        """Show ``rec`` in this rank's header line (before posting the step it rides with)."""
        assert self.local is not None
        at = self.local.rank * (LINE // 4) + 2
        self.local.segment.counters[at : at + _WORDS] = memoryview(rec).cast("I")

    def read(self) -> list[bytes]:
        """Every rank's shown record (after waiting for the step each posted with it)."""
        assert self.local is not None
        c = self.local.segment.counters
        return [
            c[r * (LINE // 4) + 2 : r * (LINE // 4) + 2 + _WORDS].tobytes() for r in range(self.local.size)
        ]

    def resync(self, records: list[bytes]) -> None:
        """After a disagreement: every rank's view of the slots as large as the largest asked for
        (the segment's slots grow alike on every rank)."""
        if self.local is not None:
            self.local.segment.ensure(max(record_nbytes(r) for r in records))

    def show(self, rec: bytes) -> int:
        """Through the segment: show ``rec`` as this rank's record of the next slot, once every rank
        finished the previous one; the slot's first step (``shown``, ``records_at``)."""
        loc = self.local
        assert loc is not None
        base = 3 * loc.ops
        loc.ops += 1
        loc.wait_all(base, "finish the previous operation")
        self.put(rec)
        loc.post(base + 1)
        return base

    def shown(self, base: int) -> list[bytes] | None:
        """Every rank's record of the slot ``show`` began at ``base``, if every rank showed it yet
        (None: not yet); does not wait."""
        loc = self.local
        assert loc is not None
        return self.read() if loc.posted_all(base + 1) else None

    def records_at(self, base: int) -> list[bytes]:
        """Every rank's record of the slot ``show`` began at ``base`` (waits for them), and that
        slot's end."""
        loc = self.local
        assert loc is not None
        loc.wait_all(base + 1, "submit the next operation")
        out = self.read()
        loc.post(base + 3)
        return out

    def records(self, seq: int, rec: bytes) -> list[bytes]:
        """Every rank's record for slot ``seq``."""
        if self.local is not None:
            return self.records_at(self.show(rec))
        links, ctx = self.links, Ctx.for_op(self.links, seq)
        table = np.zeros(links.size * RECORD_BYTES, np.uint8)
        if links.rank == 0:
            table[:RECORD_BYTES] = np.frombuffer(rec, np.uint8)
            rows = table.reshape(links.size, RECORD_BYTES)
            wait_all([links.recv(p, ctx.control(_SLOW[0]), rows[p]) for p in range(1, links.size)])
            wait_all([links.send(p, ctx.control(_SLOW[1]), table) for p in range(1, links.size)])
        else:
            mine = np.frombuffer(rec, np.uint8).copy()
            h = links.send(0, ctx.control(_SLOW[0]), mine)
            links.recv(0, ctx.control(_SLOW[1]), table).wait()
            h.wait()
        return [table[r * RECORD_BYTES : (r + 1) * RECORD_BYTES].tobytes() for r in range(links.size)]

    def queues(self, seq: int, blob: bytes) -> list[bytes]:
        """Every rank's ``blob`` (each to every other: the slow path only)."""
        links, ctx = self.links, Ctx.for_op(self.links, seq)
        peers = [p for p in range(links.size) if p != links.rank]
        n = np.array([len(blob)], np.int64)
        lens = {p: np.zeros(1, np.int64) for p in peers}
        hs = [links.send(p, ctx.control(_SLOW[2]), n) for p in peers]
        wait_all([links.recv(p, ctx.control(_SLOW[2]), lens[p]) for p in peers] + hs)
        data = np.frombuffer(blob, np.uint8).copy()
        got = {p: np.zeros(int(lens[p][0]), np.uint8) for p in peers}
        hs = [links.send(p, ctx.control(_SLOW[2] + 1), data) for p in peers]
        wait_all([links.recv(p, ctx.control(_SLOW[2] + 1), got[p]) for p in peers] + hs)
        return [blob if r == links.rank else got[r].tobytes() for r in range(links.size)]
