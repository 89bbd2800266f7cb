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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer_core.compression import Compressor, get_compressor
from trainer_core.compression.codec import check_meta, decode, decode_sum

from ..algorithms import ring
from ..primitives.links import Ctx, Handle, wait_all
from ..primitives.reduce import ReduceSpec

_LEN = np.dtype("<u4")
_HEAD_ROOM = 256  # bytes kept before a payload in a message buffer: its length and metadata
OPS = ("sum", "mean")


def pack(payload: Any, meta: dict[str, Any], into: np.ndarray | None = None) -> np.ndarray:
    """One message: the metadata's length (uint32), the metadata as JSON, the payload bytes (in
    the first bytes of the uint8 ``into`` where given and large enough, else a fresh array)."""
    head = json.dumps(meta, separators=(",", ":")).encode()
    body = np.ascontiguousarray(payload).view(np.uint8).reshape(-1)
    n = _LEN.itemsize + len(head) + body.size
    out = into[:n] if into is not None and into.size >= n else np.empty(n, dtype=np.uint8)
    out[: _LEN.itemsize] = np.frombuffer(np.array([len(head)], dtype=_LEN).tobytes(), np.uint8)
    out[_LEN.itemsize : _LEN.itemsize + len(head)] = np.frombuffer(head, np.uint8)
    out[_LEN.itemsize + len(head) :] = body
    return out


def split(msg: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """A ``pack``ed message's payload bytes and metadata (checked)."""
    hl = int(msg[: _LEN.itemsize].view(_LEN)[0])
    meta = check_meta(json.loads(bytes(msg[_LEN.itemsize : _LEN.itemsize + hl]).decode()))
    return msg[_LEN.itemsize + hl :], meta


def unpack(msg: np.ndarray, n: int, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """Decode a ``pack``ed message into ``n`` values of ``dtype`` (into ``out`` where given: flat,
    C-contiguous)."""
    body, meta = split(msg)
    return np.asarray(decode(body, meta, n, dtype, out)).reshape(-1)


def unpack_sum(msgs: list[np.ndarray], n: int, dtype: np.dtype, out: np.ndarray, scratch: np.ndarray) -> None:
    """``out`` (flat, ``n`` values of ``dtype``) becomes the sum of the ``pack``ed ``msgs`` decoded,
    added in their order: the bits of ``unpack`` of each and numpy's adds, in one pass over ``out``
    where the compressor has a kernel for it (``scratch``, like ``out``, serves the others)."""
    decode_sum([split(m) for m in msgs], n, dtype, out, scratch)


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


def allreduce(
    ctx: Ctx,
    flat: np.ndarray,
    spec: ReduceSpec,
    state: KeyState,
    count: int | None = None,
    out: np.ndarray | None = None,
    keep: dict[int, np.ndarray] | None = None,
    plus: np.ndarray | None = None,
    decode: bool = True,
) -> np.ndarray:
    """The compressed reduction of every rank's ``flat`` (float16/32/64; op sum or mean): a fresh
    array, bit-identical on every rank. ``mean`` divides by ``count`` (default: the ranks here; the
    hierarchical path passes the whole group's, each leader's ``flat`` being its host's sum);
    ``out`` (may be ``flat``, which is read before ``out`` is written) receives the result;
    ``keep`` (a dict) receives every chunk's stage-two payload by rank (``expand`` rebuilds the
    result from them); ``plus`` (like ``flat``, read before ``out`` is written): this rank's
    input is ``flat + plus``, added in their dtype as each chunk is encoded (``Compressor.encode``'s
    ``plus``: never formed where the compressor ``encodes_sum``); ``decode=False`` (with
    ``keep``): stage two's payloads are only kept, ``out`` is not written (the caller ``expand``s
    them, as the hierarchical path's leader does once it has shared them with its host).

    Pipelined: a rank encodes the chunk of one peer and posts it before encoding the next (its own
    chunk last), so the wire carries chunk ``k`` while chunk ``k+1`` is encoded; once every
    peer's payload is in, it decodes and sums them all in one pass (``unpack_sum``), and in the
    second stage each owner sends its encoded reduced chunk straight to every peer (the ring's
    allgather bytes, without its ``size-1`` forwarding hops), decoded into the result on arrival."""
    size = ctx.size
    if spec.op not in OPS:
        raise ValueError(f"compressed allreduce sums or averages, not {spec.op!r}")
    bounds = ring.blocks(flat.size, size)
    if not decode and keep is None:
        raise ValueError("decode=False keeps stage two's payloads: give keep")
    msgs = _reduce_scatter(ctx.phase(0), flat, bounds, state, plus)
    a, b = bounds[ctx.rank]
    divisor = (size if count is None else count) if spec.op == "mean" else 1
    mine = _second(ctx, state.server, msgs, b - a, spec, divisor)
    out = np.empty_like(flat) if out is None else out
    _allgather(ctx.phase(1), mine, bounds, out if decode else None, keep)
    return out


def _second(
    ctx: Ctx, server: Compressor, msgs: list[np.ndarray], n: int, spec: ReduceSpec, divisor: int
) -> np.ndarray:
    """This rank's chunk as every rank sent it (``msgs``, by rank), summed in rank order, divided
    by ``divisor`` (``mean``), encoded by the second-stage compressor and ``pack``ed: where the
    compressor ``encodes_payload_sum``, in one pass that never writes the sum (the same bytes),
    else decoded and summed in one pass into a row of the group's scratch (``unpack_sum``: kept
    between operations, fresh arrays faulted in their pages every time), then encoded."""
    pairs = [split(m) for m in msgs]
    dtype = spec.dtype
    if divisor != 1 and dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        fused = False  # (float16's mean is divided in float32: ``ReduceSpec.finish``)
    else:
        fused = server.encodes_payload_sum(pairs, dtype)
    if fused:
        room = ctx.buffer("compressed/payload", np.dtype(np.uint8), server.wire_bytes(n, dtype))
        rows = ctx.buffer("compressed/rows", np.dtype(np.uint8), sum(p.size for p, _ in pairs))
        payload, meta = server.encode_payload_sum(pairs, n, dtype, divisor, into=room, scratch=rows)
        body = np.asarray(payload)
        return pack(body, meta, ctx.buffer("compressed/sent2", np.dtype(np.uint8), body.nbytes + _HEAD_ROOM))
    work = ctx.buffer("compressed", dtype, 2 * n).reshape(2, n)
    unpack_sum(msgs, n, dtype, work[0], work[1])
    spec.finish(work[0], divisor)
    return _encode(ctx, "compressed/sent2", server, work[0])


def publish(keep: dict[int, np.ndarray], ctx: Ctx | None = None) -> np.ndarray:
    """The stage-two payloads ``keep``s by rank as one uint8 array: their lengths (int64), then
    each in rank order (in ``ctx``'s scratch where given, kept from one operation to the next)."""
    msgs = [keep[r] for r in range(len(keep))]
    head = np.array([m.size for m in msgs], dtype=np.int64).view(np.uint8)
    n = head.size + sum(m.size for m in msgs)
    form = np.empty(n, np.uint8) if ctx is None else ctx.buffer("compressed/form", np.dtype(np.uint8), n)
    np.concatenate([head, *msgs], out=form)
    return form


def expand(form: np.ndarray, out: np.ndarray, size: int) -> None:
    """Decode a ``publish``ed form of ``size`` payloads into ``out`` (flat): what ``allreduce``'s
    stage two wrote there."""
    lengths = form[: 8 * size].view(np.int64)
    at = 8 * size
    for r, (lo, hi) in enumerate(ring.blocks(out.size, size)):
        n = int(lengths[r])
        unpack(form[at : at + n], hi - lo, out.dtype, out[lo:hi])
        at += n


def _encode(
    ctx: Ctx, key: str, comp: Compressor, chunk: np.ndarray, plus: np.ndarray | None = None
) -> np.ndarray:
    """``chunk`` (plus ``plus``) encoded with ``comp``, ``pack``ed into the group's scratch buffer
    ``key`` (the payload itself in another, reused by every encoding: kept from one operation to
    the next, neither is faulted in again)."""
    room = ctx.buffer("compressed/payload", np.dtype(np.uint8), comp.wire_bytes(chunk.size, chunk.dtype))
    payload, meta = comp.encode(chunk, plus, into=room)
    body = np.asarray(payload)
    return pack(body, meta, ctx.buffer(key, np.dtype(np.uint8), body.nbytes + _HEAD_ROOM))


def _order(ctx: Ctx) -> tuple[list[int], list[int]]:
    """The peers to send to (``rank+1`` first) and to wait for (``rank-1`` first: the peer that
    sends to this rank first)."""
    size, rank = ctx.size, ctx.rank
    return [(rank + k) % size for k in range(1, size)], [(rank - k) % size for k in range(1, size)]


def _post(ctx: Ctx, peer: int, msg: np.ndarray) -> list[Handle]:
    return [
        ctx.links.send(peer, ctx.tag(0), np.array([msg.size], dtype=np.int64)),
        ctx.links.send(peer, ctx.tag(1), msg),
    ]


def _receive(ctx: Ctx, peers: list[int], key: str) -> Iterator[tuple[int, np.ndarray]]:
    """Posts the receives of every peer's length now; then yields each peer's message (length
    first, then the bytes, into the group's scratch buffer ``key/peer``), in ``peers``' order, as
    it comes."""
    lengths = {p: np.zeros(1, dtype=np.int64) for p in peers}
    heads = {p: ctx.links.recv(p, ctx.tag(0), lengths[p]) for p in peers}
    return _bodies(ctx, peers, lengths, heads, key)


def _bodies(
    ctx: Ctx, peers: list[int], lengths: dict[int, np.ndarray], heads: dict[int, Handle], key: str
) -> Iterator[tuple[int, np.ndarray]]:
    for p in peers:
        heads[p].wait()
        msg = ctx.buffer(f"{key}/{p}", np.dtype(np.uint8), int(lengths[p][0]))
        ctx.links.recv(p, ctx.tag(1), msg).wait()
        yield p, msg


def _reduce_scatter(
    ctx: Ctx, flat: np.ndarray, bounds: list[tuple[int, int]], state: KeyState, plus: np.ndarray | None
) -> list[np.ndarray]:
    """Stage 1: chunk ``c`` encoded with ``state.workers[c]`` (of ``flat + plus``, where ``plus``
    is given) goes to rank ``c``; returns this rank's chunk as every rank sent it (its messages,
    by rank: ``_second`` sums them)."""
    rank = ctx.rank
    to, frm = _order(ctx)
    a, b = bounds[rank]
    got = _receive(ctx, frm, "compressed/got1")
    sends: list[Handle] = []
    for p in to:
        lo, hi = bounds[p]
        more = None if plus is None else plus[lo:hi]
        sends += _post(ctx, p, _encode(ctx, f"compressed/sent1/{p}", state.workers[p], flat[lo:hi], more))
    more = None if plus is None else plus[a:b]
    msgs = {rank: _encode(ctx, f"compressed/sent1/{rank}", state.workers[rank], flat[a:b], more)}
    msgs.update(got)
    wait_all(sends)
    return [msgs[r] for r in range(ctx.size)]


def _allgather(
    ctx: Ctx,
    mine: np.ndarray,
    bounds: list[tuple[int, int]],
    out: np.ndarray | None,
    keep: dict[int, np.ndarray] | None = None,
) -> None:
    """Stage 2: this rank's encoded reduced chunk to every peer; every chunk (its own included)
    decoded into ``out`` (None: not decoded) and kept, by rank, in ``keep``."""
    to, frm = _order(ctx)
    got = _receive(ctx, frm, "compressed/got2")
    sends = [h for p in to for h in _post(ctx, p, mine)]
    a, b = bounds[ctx.rank]
    if out is not None:
        unpack(mine, b - a, out.dtype, out[a:b])
    if keep is not None:
        keep[ctx.rank] = mine
    for p, msg in got:
        lo, hi = bounds[p]
        if out is not None:
            unpack(msg, hi - lo, out.dtype, out[lo:hi])
        if keep is not None:
            keep[p] = msg
    wait_all(sends)
