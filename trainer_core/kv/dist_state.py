"""The servers' state of a ``DistKVStore``, for checkpoints: ``server_state`` and ``load_server_state``.

Both are collective (every worker calls them at the same point, between rounds): every worker
first waits for its own requests, all meet in a barrier, rank 0 asks every server (wire ops
``get_state`` / ``set_state``, docs/wire.md), and all meet again before anyone pushes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trainer_core.errors import KVError
from trainer_core.kv.keys import KeyMeta
from trainer_core.ps import protocol
from trainer_core.ps.client import WorkerClient
from trainer_core.ps.protocol import Key
from trainer_core.ps.sharding import Part
from trainer_core.transport.channel import Received
from trainer_core.xp import to_host

#: per server: the entries, arrays, slot names and ``[key, part, slot, number]`` scalars of one message
PerServer = dict[int, tuple[list[protocol.Entry], list[np.ndarray], list[str], list[list[Any]]]]


def server_state(client: WorkerClient, meta: Mapping[Key, KeyMeta]) -> dict[Key, dict[str, Any]]:
    """The servers' state of every key of ``meta`` (every worker calls it at the same point, between
    rounds; rank 0 gets the state, the others ``{}``).

    Per key: ``value`` (the stored value; with compressed pulls it differs from what workers
    pulled), ``opt/<slot>`` (the server optimizer's arrays, e.g. ``opt/mom``, ``opt/m``, ``opt/v``,
    and its step counter ``opt/t`` as an int), the parts of a split key reassembled into the key's
    shape; ``pull/<part>/<slot>`` (each part's pull compressor state, e.g. its error-feedback
    ``residual``)."""
    client.drain()
    client.barrier()
    out: dict[Key, dict[str, Any]] = {}
    if client.rank == 0:
        seqs = [client.send(s, protocol.GET_STATE, local=False) for s in range(client.book.num_servers)]
        replies = client.wait(seqs)
        for server, seq in enumerate(seqs):
            _take_state(meta, server, replies[seq], out)
        for k, state in out.items():
            for name in [n for n in state if n.startswith("opt/") and isinstance(state[n], list)]:
                values = set(state[name])
                if len(values) != 1:
                    raise KVError(f"key {k!r}: servers disagree on {name} ({sorted(values)})")
                state[name] = values.pop()
    client.barrier()
    return out


def _take_state(
    meta: Mapping[Key, KeyMeta], server: int, reply: Received, out: dict[Key, dict[str, Any]]
) -> None:
    """Check one ``get_state`` reply and copy its arrays into ``out`` (parts into whole keys)."""
    h = reply.header
    slots, scalars = protocol.state_body(h)
    if len(reply.frames) != len(h.entries):
        raise KVError(
            f"server {server}: state reply with {len(reply.frames)} frames for {len(h.entries)} entries"
        )

    def part_of(key: Key, index: int) -> tuple[KeyMeta, Part]:
        m = meta.get(key)
        if m is None or not 0 <= index < len(m.parts) or m.parts[index].server != server:
            raise KVError(f"server {server} sent state of key {key!r} part {index}, which it does not hold")
        return m, m.parts[index]

    for e, slot, frame in zip(h.entries, slots, reply.frames, strict=True):
        m, p = part_of(e.key, e.part)
        dtype = np.dtype(e.dtype)
        if len(frame.buffer) != e.size * dtype.itemsize:
            raise KVError(f"server {server}: state of key {e.key!r} has a frame of the wrong size")
        arr = np.frombuffer(frame.buffer, dtype=dtype)
        state = out.setdefault(e.key, {})
        if slot.startswith("pull/"):
            state[f"pull/{p.index}/{slot[5:]}"] = arr.copy()
            continue
        if e.size != p.size or (slot == "value" and dtype != m.dtype):
            raise KVError(f"server {server}: state {slot} of key {e.key!r} does not fit the key")
        whole = state.get(slot)
        if whole is None:
            whole = state[slot] = np.zeros(m.shape, dtype=dtype)
        whole.reshape(-1)[p.start : p.stop] = arr
    for key, index, slot, value in scalars:
        part_of(key, index)
        if not slot.startswith("opt/"):
            raise KVError(f"server {server}: unexpected state scalar {slot!r}")
        out.setdefault(key, {}).setdefault(slot, []).append(value)


def load_server_state(
    client: WorkerClient, key_meta: Callable[[Key], KeyMeta], state: dict[Key, dict[str, Any]]
) -> None:
    """Restore ``server_state()`` on the servers (every worker calls it at the same point, after
    ``set_optimizer``, ``set_gradient_compression`` and ``init``; rank 0's ``state`` is sent, the
    others' is ignored). A key named in ``state`` gets its value, optimizer state and pull
    residuals replaced (those missing start from zero); other keys are untouched. ``key_meta``
    looks a key up (``KVError`` if unknown)."""
    client.drain()
    client.barrier()
    if client.rank == 0:
        per_server: PerServer = {s: ([], [], [], []) for s in range(client.book.num_servers)}
        for k, slots in state.items():
            m = key_meta(k)
            for name, value in slots.items():
                _put_state(m, k, name, value, per_server)
        seqs = [
            client.send(s, protocol.SET_STATE, e, a, body={"slots": sl, "scalars": sc}, local=False)
            for s, (e, a, sl, sc) in per_server.items()
            if e or sc
        ]
        client.wait(seqs)
    client.barrier()


def _put_state(m: KeyMeta, k: Key, name: str, value: Any, per_server: PerServer) -> None:
    """Split one state slot of key ``k`` into its parts' messages."""
    if name.startswith("pull/"):
        index_s, _, slot = name[5:].partition("/")
        if not index_s.isdigit() or int(index_s) >= len(m.parts):
            raise KVError(f"key {k!r}: bad state slot {name!r}")
        p = m.parts[int(index_s)]
        arr = np.ascontiguousarray(to_host(value)).reshape(-1)
        entries, arrays, slots, _ = per_server[p.server]
        entries.append(protocol.Entry(k, p.index, arr.size, arr.dtype.str))
        arrays.append(arr)
        slots.append(f"pull/{slot}")
        return
    if not (name == "value" or name.startswith("opt/")):
        raise KVError(f"key {k!r}: unknown state slot {name!r}")
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        number = value.item() if isinstance(value, np.generic) else value
        for p in m.parts:
            per_server[p.server][3].append([k, p.index, name, number])
        return
    flat = np.ascontiguousarray(to_host(value)).reshape(-1)
    if flat.size != m.size:
        raise KVError(f"key {k!r}: state {name!r} has {flat.size} elements, the key {m.size}")
    if flat.dtype.str not in protocol.DTYPES:
        raise KVError(f"key {k!r}: state {name!r} has an unsupported dtype {flat.dtype}")
    for p in m.parts:
        entries, arrays, slots, _ = per_server[p.server]
        entries.append(protocol.Entry(k, p.index, p.size, flat.dtype.str))
        arrays.append(flat[p.start : p.stop])
        slots.append(name)
