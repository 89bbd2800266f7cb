"""Request tracking (ps-lite's Customer): sequence numbers, what is in flight, the replies that came.

A node numbers each request it sends (``next``); ``expect`` marks one whose reply it will wait
for; ``arrived`` files each reply received (``False``: nobody waits for it, e.g. a forgotten
request's); ``wait`` returns the replies of the requests asked for, calling ``pump`` (which
receives and files replies, and raises when the job failed) until they have come. Pure
bookkeeping: the channels and the failure policy are the caller's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from trainer_core.transport.channel import Received


class Requests:
    """One node's requests in flight and the replies waiting to be taken."""

    def __init__(self) -> None:
        self.seq = itertools.count(1)  # shared by every request of the node (replay protection)
        self.outstanding: set[int] = set()
        self.unclaimed: set[int] = set()  # requests whose replies nobody waits for any more (``forget``)
        self.replies: dict[int, Received] = {}

    def next(self) -> int:
        return next(self.seq)

    def expect(self, seq: int) -> None:
        """The reply to ``seq`` will be waited for."""
        self.outstanding.add(seq)

    def arrived(self, msg: Received) -> bool:
        """File a reply: ``True`` if its request is waited for, else (``False``) it is the caller's
        to drop."""
        seq = msg.header.seq
        if seq in self.outstanding:
            self.outstanding.discard(seq)
            self.replies[seq] = msg
            return True
        self.unclaimed.discard(seq)
        return False

    def forget(self, seq: int) -> Received | None:
        """Wait no more for the reply to ``seq``: the reply if it came already (the caller's to drop),
        else ``None`` (it is dropped by ``arrived`` when it comes)."""
        msg = self.replies.pop(seq, None)
        if msg is None and seq in self.outstanding:
            self.outstanding.discard(seq)
            self.unclaimed.add(seq)
        return msg

    def wait(self, seqs: Iterable[int], pump: Callable[[], None]) -> dict[int, Received]:
        """The replies of ``seqs``, calling ``pump`` until each has come."""
        want = list(seqs)
        replies = self.replies
        for s in want:
            while s not in replies:
                pump()
        return {s: replies.pop(s) for s in want}

    def drain(self, pump: Callable[[], None]) -> None:
        """Until every expected reply has come."""
        while self.outstanding:
            pump()
