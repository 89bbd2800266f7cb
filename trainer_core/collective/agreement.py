"""What the ranks of a group agree on before an operation's data moves: pure, no I/O.

Every operation a rank submits carries a ``Descriptor``: its name (the caller's, or ``noname.N``
from the rank's own count of unnamed operations, as Horovod names them), its kind (allreduce,
broadcast, ...), and what must match on every rank: shape, dtype, op, root, group. A rank whose
own checks refused the operation (a bad ``op``, a list for an array) says why (``refused``).

Each slot of a group's sequence starts with every rank's ``record`` of the operation at the head
of its queue: a digest of the descriptor, whether it was refused, and its byte count (32 bytes).
Equal records, none refused: that operation runs. Otherwise every rank hands every other its
whole queue of descriptors and ``decide`` (the same function of the same lists on every rank)
says what the slot does: run the operation of one name that every rank has submitted (the heads'
common name, else the first of rank 0's queue that every rank holds), fail it on every rank
(``CollectiveMismatch``, naming which ranks passed what), or wait for more submissions.

A rank whose queue's head is a ``join`` has joined (Horovod's ``hvd.join``): the slot runs what the
other ranks agree on, and each joined rank stands in for it (``Decision.standin``: the descriptor
it builds its part from, ``joining.standin``), until every rank's head is the join.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from typing import Any

from trainer_core.errors import KVError

RECORD_BYTES = 32
JOIN = "join"
#: the kinds a joined rank stands in for (zeros, no rows, or the root's value it discards)
STANDS_IN = ("allreduce", "grouped_allreduce", "allgather", "broadcast", "reduce_scatter", "barrier")
_REFUSED = 1
_RECORD = struct.Struct("<16sIQ4x")


class CollectiveMismatch(KVError, ValueError):
    """The ranks submitted different operations under one name (or one rank refused it): raised
    on every rank, for that operation only; the group goes on."""


#: the fields compared across ranks, in the order a difference is reported, and their words
FIELDS: tuple[tuple[str, str], ...] = (("kind", "operations"), ("dtype", "dtypes"), ("shape", "shapes"))
FIELDS += (("op", "ops"), ("root", "roots"), ("group", "groups"))


@dataclass(slots=True)
class Descriptor:
    """One rank's account of one operation (``shape``: a tuple, or a list of them for grouped
    operations; ``None`` for the ragged first axis of allgather)."""

    name: str
    kind: str
    shape: Any = ()
    dtype: str = ""
    op: str = ""
    root: int = -1
    group: str = ""
    refused: str = ""
    #: the bytes it adds to a fusion buffer (``batching``; 0: it runs alone)
    fuse: int = 0

    def body(self) -> bytes:
        """The digest of everything but the name, ``refused`` and ``fuse`` (cached: a repeated step
        hashes only its name)."""
        return body(self.kind, self.shape, self.dtype, self.op, self.root, self.group)

    def record(self, nbytes: int = 0) -> bytes:
        """The 32 bytes every rank shows the others for the head of its queue."""
        return record(self.name, self.body(), nbytes, bool(self.refused))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Descriptor:
        shape = d.get("shape")
        return cls(**{**d, "shape": _tuples(shape)})


@functools.lru_cache(maxsize=1024)
def body(kind: str, shape: Any, dtype: str, op: str, root: int, group: str) -> bytes:
    """The 16-byte digest of a descriptor's fields but its name (``Descriptor.body``)."""
    text = json.dumps([kind, shape, dtype, op, root, group])
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def record(name: str, body: bytes, nbytes: int = 0, refused: bool = False) -> bytes:
    """The record of the operation ``name`` whose other fields digest to ``body``."""
    digest = hashlib.blake2b(name.encode() + body, digest_size=16).digest()
    return _RECORD.pack(digest, _REFUSED if refused else 0, nbytes)


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def record_nbytes(record: bytes) -> int:
    return int(_RECORD.unpack(record)[2])


def agreed(records: list[bytes]) -> bool:
    """Whether every rank showed the same record, none refused."""
    first = records[0]
    return all(r == first for r in records) and not _RECORD.unpack(first)[1] & _REFUSED


def encode(queue: list[Descriptor]) -> bytes:
    return json.dumps([d.to_json() for d in queue]).encode()


def decode(blob: bytes) -> list[Descriptor]:
    return [Descriptor.from_json(d) for d in json.loads(blob.decode())]


@dataclass(frozen=True)
class Decision:
    """What one slot does: run ``name`` (its descriptors agreed), fail it with ``error`` on every
    rank, or (``name`` None) wait for more submissions. ``standin``: where some ranks have joined,
    the descriptor of ``name`` the others submitted (a joined rank builds its part from it)."""

    name: str | None
    error: str = ""
    standin: Descriptor | None = None


def decide(queues: list[list[Descriptor]]) -> Decision:
    """The slot's decision from every rank's queue (head first), in rank order."""
    joined = [r for r, q in enumerate(queues) if q and q[0].kind == JOIN]
    if joined and len(joined) < len(queues):
        return _with_joined(queues, joined)
    heads = {q[0].name for q in queues if q}
    name: str | None
    if len(heads) == 1 and all(queues):
        name = next(iter(heads))
    else:  # (a join waits for the operations queued before it: never chosen from behind)
        held = [{d.name for d in q} for q in queues]
        name = next((d.name for d in queues[0] if d.kind != JOIN and all(d.name in h for h in held)), None)
        if name is None:
            return Decision(None)
    mine = [next(d for d in q if d.name == name) for q in queues]
    return Decision(name, mismatch(mine))


def _with_joined(queues: list[list[Descriptor]], joined: list[int]) -> Decision:
    """The decision where the ranks ``joined`` have joined: what the others agree on, which each
    joined rank stands in for (or which fails on every rank where a joined rank cannot)."""
    live = [q for r, q in enumerate(queues) if r not in joined]
    sub = decide(live)
    if sub.name is None:
        return sub
    desc = next(d for d in live[0] if d.name == sub.name)
    return Decision(sub.name, sub.error or standin_error(desc, joined), desc)


def standin_error(desc: Descriptor, joined: list[int]) -> str:
    """Why the ranks ``joined`` cannot stand in for ``desc`` ('' where they can)."""
    head = f"collective {desc.kind} {desc.name!r}"
    if desc.kind not in STANDS_IN:
        return (
            f"{head} cannot run while {_ranks(joined)} joined (hvd.join): a joined rank takes part "
            f"only in {', '.join(STANDS_IN)}; it fails on every rank"
        )
    if desc.kind == "broadcast" and desc.root in joined:
        return f"{head}: its root, rank {desc.root}, has joined (hvd.join) and sends nothing; it fails on every rank"
    return ""


def mismatch(descs: list[Descriptor]) -> str:
    """The error of one operation whose rank ``r`` passed ``descs[r]`` ('' where they agree)."""
    head = f"collective {_kinds(descs)} {descs[0].name!r}"
    refused = [(r, d.refused) for r, d in enumerate(descs) if d.refused]
    if refused:
        why = "; ".join(f"rank {r}: {text}" for r, text in refused)
        return f"{head} refused by {_ranks([r for r, _ in refused])} ({why}): it fails on every rank"
    diffs = []
    kinds = len({d.kind for d in descs}) > 1  # then op and root (each kind's own) go unsaid
    for field, words in FIELDS if not kinds else FIELDS[:3]:
        values = [getattr(d, field) for d in descs]
        if any(v != values[0] for v in values):
            diffs.append(f"different {words}: {_who(values)}")
    if not diffs:
        return ""
    return f"{head}: the ranks passed " + "; ".join(diffs)


def _kinds(descs: list[Descriptor]) -> str:
    return "/".join(dict.fromkeys(d.kind for d in descs))


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _show(v: Any) -> str:
    if v is None:
        return "(ragged,)"
    if isinstance(v, tuple):
        return str(v) if not v or not isinstance(v[0], tuple) else "[" + ", ".join(map(str, v)) + "]"
    return str(v) if v != "" else "-"


def _who(values: list[Any]) -> str:
    """``rank 0 (4,), ranks 1, 2 (5,)``: which ranks passed which value."""
    by: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        by.setdefault(_show(v), []).append(r)
    return ", ".join(f"{_ranks(rs)} {v}" for v, rs in by.items())
