"""Compressed allreduce with error feedback, in two stages (DeepSpeed's 1-bit Adam form).

The flat gradient is cut into ``size`` chunks (``ring.blocks``), chunk ``c`` owned by rank ``c``.

1. Reduce-scatter: every rank compresses each chunk with that chunk's own worker compressor (its
   residual keeps what the payload lost) and sends the payload to the chunk's owner (an
   all-to-all). The owner decodes the ``size`` payloads and sums them in rank order (``mean``:
   divides by ``size``).
2. Allgather: the owner compresses the reduced chunk again with its own second ("server")
   compressor and residual; the payloads go round the ring (a ragged allgather) and every rank,
   the owner included, decodes them. Every rank decodes the same bytes with the same code, so all
   end bit-identical.

A rank sends ``2 (size-1)/size`` compressed chunks' worth of bytes: the ring's traffic divided by
the compressor's ratio (plus a small header per message: the payload's metadata as JSON, never
pickle). Compressors come from ``trainer_core.compression`` by their params; float16/32/64 only.
``powersgd`` takes its own path (``lowrank``: the factors P and Q are allreduced).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer_core.compression import Compressor, get_compressor
from trainer_core.compression.codec import check_meta, decode

from .algorithms import ring
from .links import Ctx, Handle, wait_all
from .reduce import ReduceSpec

_LEN = np.dtype("<u4")
OPS = ("sum", "mean")


def pack(payload: Any, meta: dict[str, Any]) -> np.ndarray:
    """One message: the metadata's length (uint32), the metadata as JSON, the payload bytes."""
    head = json.dumps(meta, separators=(",", ":")).encode()
    body = np.ascontiguousarray(payload).view(np.uint8).reshape(-1)
    out = np.empty(_LEN.itemsize + len(head) + body.size, dtype=np.uint8)
    out[: _LEN.itemsize] = np.frombuffer(np.array([len(head)], dtype=_LEN).tobytes(), np.uint8)
    out[_LEN.itemsize : _LEN.itemsize + len(head)] = np.frombuffer(head, np.uint8)
    out[_LEN.itemsize + len(head) :] = body
    return out


def unpack(msg: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
    """Decode a ``pack``ed message into ``n`` values of ``dtype``."""
    hl = int(msg[: _LEN.itemsize].view(_LEN)[0])
    meta = check_meta(json.loads(bytes(msg[_LEN.itemsize : _LEN.itemsize + hl]).decode()))
    return np.asarray(decode(bytes(msg[_LEN.itemsize + hl :]), meta, n, dtype)).reshape(-1)


@dataclass
class KeyState:
    """One key's compressors on one rank: one per destination chunk, and one for its own chunk's
    reduced value (the second stage)."""

    workers: list[Compressor]
    server: Compressor


@dataclass
class ErrorFeedback:
    """The compression params and every key's residuals on one rank."""

    params: dict[str, Any]
    keys: dict[Any, KeyState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        get_compressor(self.params)  # refuses unknown types and bad parameters now

    def key(self, key: Any, size: int) -> KeyState:
        st = self.keys.get(key)
        if st is None:
            st = self.keys[key] = KeyState(
                [get_compressor(self.params) for _ in range(size)], get_compressor(self.params)
            )
        return st


def allreduce(ctx: Ctx, flat: np.ndarray, spec: ReduceSpec, state: KeyState) -> np.ndarray:
    """The compressed reduction of every rank's ``flat`` (float16/32/64; op sum or mean): a fresh
    array, bit-identical on every rank."""
    size, rank = ctx.size, ctx.rank
    if spec.op not in OPS:
        raise ValueError(f"compressed allreduce sums or averages, not {spec.op!r}")
    bounds = ring.blocks(flat.size, size)
    mine = _exchange(ctx.phase(0), [_encode(state.workers[c], flat[a:b]) for c, (a, b) in enumerate(bounds)])
    a, b = bounds[rank]
    reduced = unpack(mine[0], b - a, flat.dtype).copy()
    for r in range(1, size):
        spec.combine(reduced, unpack(mine[r], b - a, flat.dtype), reduced)
    spec.finish(reduced, size)
    msgs, lengths = ring.ragged_allgather(ctx.phase(1), _encode(state.server, reduced))
    out = np.empty_like(flat)
    start = 0
    for c, (a, b) in enumerate(bounds):
        out[a:b] = unpack(msgs[start : start + lengths[c]], b - a, flat.dtype)
        start += lengths[c]
    return out


def _encode(comp: Compressor, chunk: np.ndarray) -> np.ndarray:
    payload, meta = comp.encode(chunk)
    return pack(np.asarray(payload), meta)


def _exchange(ctx: Ctx, outgoing: list[np.ndarray]) -> list[np.ndarray]:
    """All-to-all of messages of any length: ``outgoing[c]`` goes to rank ``c``; returns what each
    rank sent to this one, by rank (its own message included)."""
    size, rank = ctx.size, ctx.rank
    peers = [p for p in range(size) if p != rank]
    lengths = {p: np.zeros(1, dtype=np.int64) for p in peers}
    sends: list[Handle] = []
    recvs = {p: ctx.links.recv(p, ctx.tag(0), lengths[p]) for p in peers}
    for p in peers:
        sends.append(ctx.links.send(p, ctx.tag(0), np.array([outgoing[p].size], dtype=np.int64)))
        sends.append(ctx.links.send(p, ctx.tag(1), outgoing[p]))
    incoming: list[np.ndarray] = [outgoing[rank]] * size
    bodies = {}
    for p in peers:
        recvs[p].wait()
        incoming[p] = np.empty(int(lengths[p][0]), dtype=np.uint8)
        bodies[p] = ctx.links.recv(p, ctx.tag(1), incoming[p])
    wait_all(list(bodies.values()))
    wait_all(sends)
    return incoming
