"""A repeated synchronous allreduce over the links among the ranks of one host (an algorithm
forced off the host's segment: ring, recursive doubling, tree) without a step of its own for
agreeing on it: each rank shows its record in the segment (``Exchange.show``) and sends its data at
once; the records are compared once the data moved (every rank showed its record before sending
anything, so they are all there by then), and by every long wait of the data path meanwhile
(``stall.watching``: a rank waiting for a message that a rank in another operation will never
send). Where they differ, what moved is dropped (``NetLinks.drop``: its posted receives withdrawn,
its messages discarded; the caller's output holds no result) and the slot is settled as a
disagreement, exactly as when the records are compared first (``Negotiator.quick``). A data path
that failed because the ranks disagree (a message of another length) counts as such; any other
failure is the group's, as before.

No operation runs in a slot whose records differed (the one decided on runs in the next slot,
``Negotiator._settle``), so whatever data a speculating rank sent in it is void: every rank drops
it once the slot is settled, and discards what still comes for it. docs/collectives.md, "What
agreement costs".
"""

from __future__ import annotations

from collections.abc import Callable

from .agreement import agreed
from .exchange import Exchange
from .primitives import stall
from .primitives.links import LinkError, Links


class Diverged(Exception):
    """The ranks' records of the operation whose data is moving differ: its data path stops."""


def takes(exchange: Exchange, links: Links) -> bool:
    """Whether the ranks' allreduce over ``links`` may run this way: every rank on one host (the
    records in its segment), and links that can drop an operation's messages."""
    return exchange.local is not None and links.size > 1 and hasattr(links, "drop")


def run(exchange: Exchange, links: Links, seq: int, rec: bytes, data: Callable[[], None]) -> list[bytes]:
    """Slot ``seq``: ``data()`` (the operation's data path) with this rank's record ``rec`` shown
    as it runs; every rank's record (where they differ, what ``data`` did is void: the caller
    settles the slot as a disagreement)."""
    base = exchange.show(rec)

    def diverged() -> None:
        shown = exchange.shown(base)
        if shown is not None and not agreed(shown):
            raise Diverged(f"collective allreduce (operation {seq}): the ranks' records differ")

    try:
        with stall.watching(diverged):
            data()
    except (LinkError, Diverged):
        records = exchange.records_at(base)
        if agreed(records):
            raise
        links.drop(seq)  # type: ignore[attr-defined]
        return records
    records = exchange.records_at(base)
    if not agreed(records):
        links.drop(seq)  # type: ignore[attr-defined]
    return records
