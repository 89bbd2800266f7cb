"""The collectives' own messages between workers (docs/collectives.md, "Over sockets").

They travel in the transport's envelope (``transport.wire``) on the channels between workers
(the same-host channel between workers of one machine, else the TCP data channel), authenticated
like every channel:

* ``coll_hello`` (``{"rank": r}``): the first message on a channel, from the rank that connected,
  so that the accepting rank knows whose channel it is;
* ``coll_data`` (``{"t": tag}``, one frame): one point-to-point message of a collective, matched
  by (sender, tag) to the receiver's posted receive; on the same-host channel (headers only)
  ``{"t": tag, "n": bytes}`` and, unless ``n`` is 0, one descriptor: a memfd holding the bytes
  (``sockets.channels``);
* ``coll_shm`` (``{"n": local ranks}``, one descriptor): from a host's lowest rank to each other
  rank of the host, once, when the group is set up: the host's shared-memory segment
  (``primitives.hostsegment``); ``{"n": 0}`` and no descriptor where the host has none (a channel that is not the
  same-host one, or ``PS_SHM=0``);
* ``coll_bye`` (``{"ops": n}``): the sender closed its group normally (it shut down) after its
  ``n`` operations (``n`` absent: not said); it takes part in none after them, so a rank that
  waits for it in a later one fails at once (``PeerShutDown``), and the channel's end is not a
  failure. Sent when the group is closed, before the scheduler's finish.

They carry no entries. ``SCHEMA`` is to be combined with the node layer's (``node.protocol``)
for the node's decoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainer_core.errors import WireError
from trainer_core.transport import wire

HELLO, DATA, SHM, BYE = "coll_hello", "coll_data", "coll_shm", "coll_bye"
SCHEMA = wire.Schema(frozenset({HELLO, DATA, SHM, BYE}))
MAX_TAG = (1 << 64) - 1


def hello(rank: int) -> wire.Header:
    return wire.Header(HELLO, body={"rank": rank})


def data(tag: int, nbytes: int | None = None) -> wire.Header:
    """A data message's header; ``nbytes`` on the same-host channel, whose bytes come in a memfd."""
    return wire.Header(DATA, body={"t": tag} if nbytes is None else {"t": tag, "n": nbytes})


def shm(local_size: int) -> wire.Header:
    """The host's segment for ``local_size`` ranks (its descriptor goes with it), or none (0)."""
    return wire.Header(SHM, body={"n": local_size})


def bye(ops: int | None = None, sets: Mapping[int, int] | None = None) -> wire.Header:
    """The sender closed its group after its ``ops`` operations (slots) ``0 .. ops - 1``, and the
    groups of the process sets it was in after theirs (``sets``: id -> operations)."""
    body: dict[str, Any] = {} if ops is None else {"ops": ops}
    if sets:
        body["sets"] = {str(sid): n for sid, n in sets.items()}
    return wire.Header(BYE, body=body)


def sets_of(h: wire.Header) -> dict[int, int]:
    """The operations of each process set a ``coll_bye`` says its sender took part in (entries
    that are not a set's id and a count are left out)."""
    raw = h.body.get("sets")
    if not isinstance(raw, dict):
        return {}
    out = {}
    for k, n in raw.items():
        if isinstance(k, str) and k.isdigit() and wire.is_int(n) and n >= 0:
            out[int(k)] = int(n)
    return out


def ops_of(h: wire.Header) -> int | None:
    """The operations a ``coll_bye`` says its sender took part in (None: not said, or not a count)."""
    try:
        n = wire.body_int(h, "ops")
    except WireError:
        return None
    return n if n >= 0 else None


def tag_of(h: wire.Header) -> int:
    """The tag of a ``coll_data`` header (``WireError`` if it is not a 64-bit unsigned integer)."""
    tag = wire.body_int(h, "t")
    if not 0 <= tag <= MAX_TAG:
        raise WireError(f"tag {tag} out of range")
    return tag
