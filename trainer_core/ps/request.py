"""What the server's store works on: the request being served (``Request``) and the state of one
key part (``KeyState``). ``store.py`` serves them; ``handler.py`` builds the requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer_core.ps import protocol


class Request:
    """One worker message being served: per entry, its input data (a view of a shared-memory segment
    or of a received frame) and where its result goes (a shared-memory view, or ``None``: returned
    as a frame); the results as they are made."""

    __slots__ = (
        "failed",
        "header",
        "ident",
        "inputs",
        "lends",
        "metas",
        "outputs",
        "rank",
        "remaining",
        "results",
        "share",
        "shared",
    )

    def __init__(
        self,
        ident: Any,
        header: protocol.Header,
        rank: int,
        inputs: list[np.ndarray | None],
        outputs: list[np.ndarray | None],
        share: bool = False,
        lends: bool = False,
    ) -> None:
        n = len(header.entries)
        self.ident = ident  # who to answer: the role's reply Peer (a channel, or a ZeroMQ routing peer); None in process
        self.header = header
        self.rank = rank
        self.inputs = inputs
        self.outputs = outputs
        self.share = share  # the worker can read results from this server's shared buffers (same host)
        # a round may read the inputs where they lie instead of copying them: its worker writes
        # them again only once this or a later request of it is answered (``Store.release``)
        self.lends = lends
        self.remaining = n
        self.results: list[np.ndarray | None] = [None] * n
        self.shared = [False] * n  # result i is the stored array itself, not a copy
        self.metas: list[dict[str, Any] | None] = [None] * n  # compressed results' metadata
        self.failed = False  # answered with an error already (``Store.stuck``): no other answer


@dataclass
class KeyState:
    """One key part on this server."""

    weight: np.ndarray
    acc: np.ndarray | None = None
    pushed: set[int] = field(default_factory=set)
    waiting: list[tuple[Request, int]] = field(default_factory=list)
    deferred: list[tuple[Request, int]] = field(default_factory=list)
    queued: set[int] = field(default_factory=set)  # the ranks with an entry in ``deferred``
    opt_state: dict[str, Any] | None = None
    version: int = 0  # changes with every new value (compressed pulls encode each version once)
    # The round's first push when its request lends its inputs (``Request.lends``): summed with the
    # second push straight into ``acc`` instead of being copied there first; ``lender`` is its request.
    lent: np.ndarray | None = None
    lender: Request | None = None
    # An elastic job's round: each worker's push apart, by its id (``ps/rounds.py``)
    parts: dict[int, np.ndarray] = field(default_factory=dict)
    entered: set[int] = field(default_factory=set)  # the newcomers that have pushed to this key
