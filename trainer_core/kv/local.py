"""The one-process store (``local``, ``device``): the server's store (``ps.store.Store``) with one
worker, in process.

Every push, pull and state request is served by the same ``Store`` code as a ``dist`` job's server
(sums, optimizer, compressed pulls, state for checkpoints), with a worker's side in front of it:
the sum of a key's values on push, the worker's gradient compression (``WorkerCodec``: a push is
encoded and decoded with the worker's residual, a compressed pull is decoded) and its byte
counters. So it computes exactly what a ``dist`` job with one worker and one server computes: the
single-process reference for compressed training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainer_core.compression.codec import WorkerCodec, resolve_compression, validate_params
from trainer_core.compression.codec import decode as gc_decode
from trainer_core.errors import KVError
from trainer_core.kv.api import KVStore, check_key, normalize, write_out
from trainer_core.kv.results import decode_into, direct_target
from trainer_core.optim.server import to_spec
from trainer_core.ps import protocol
from trainer_core.ps.protocol import Key
from trainer_core.ps.request import Request
from trainer_core.ps.store import Store
from trainer_core.xp import flat_sum, is_device_array, to_host


class LocalKVStore(KVStore):
    """``local``/``device``: one process; push sums a key's values, then applies the optimizer or stores the sum.

    With gradient compression on, a push goes through the worker's encode and decode (its residual)
    and a pull through the server's (one residual per key), exactly as in a ``dist`` job with one
    worker."""

    def __init__(self, name: str = "local") -> None:
        self.type = name
        self.store = Store(num_workers=1)
        self.shapes: dict[Key, tuple[int, ...]] = {}
        self.compression: dict[str, Any] | None = None
        self.codec = WorkerCodec()

    def _weight(self, key: Key) -> np.ndarray:
        st = self.store.keys.get((key, 0))
        if st is None:
            raise KVError(f"key {key!r} was not initialized")
        return st.weight

    def _serve(self, op: str, key: Key, data: np.ndarray | None, like: np.ndarray) -> Request:
        """One request of worker 0 for ``key`` (``like``: its size and dtype); one worker's requests
        complete at once."""
        entry = protocol.Entry(key, 0, like.size, like.dtype.str)
        req = Request(None, protocol.Header(op=op, entries=(entry,)), 0, [data], [None])
        done = self.store.handle(req)
        assert done == [req], "a one-worker store answers every request at once"
        return req

    def init(self, key: Key | Sequence[Key], value: Any) -> None:
        for k, vals in normalize(key, value):
            host = to_host(vals[0])
            flat = np.ascontiguousarray(host).reshape(-1)
            self._serve(protocol.INIT, k, flat, flat)
            self.shapes[k] = host.shape

    def initialized(self, key: Key) -> bool:
        return key in self.shapes

    def push(self, key: Key | Sequence[Key], value: Any) -> None:
        for k, vals in normalize(key, value):
            weight = self._weight(k)
            compress = self.codec.active(weight.dtype)
            # compressed: summed and encoded on the device of cupy values, only the payload copied
            grad = flat_sum(vals, weight.dtype, device=compress)
            if grad.size != weight.size:
                raise KVError(f"key {k!r}: pushed {grad.size} elements, stored {weight.size}")
            stats = self.codec.stats
            stats.raw_sent += grad.nbytes
            if compress:
                payload, meta = self.codec.encode(k, 0, grad)
                stats.sent += payload.nbytes
                grad = gc_decode(payload, meta, grad.size, grad.dtype)
            else:
                stats.sent += grad.nbytes
            self._serve(protocol.PUSH, k, grad, weight)

    def pull(self, key: Key | Sequence[Key], out: Any) -> Any:
        for k, outs in normalize(key, out):
            weight = self._weight(k)
            req = self._serve(protocol.PULL, k, None, weight)
            result, meta = req.results[0], req.metas[0]
            assert result is not None
            stats = self.codec.stats
            stats.raw_received += weight.nbytes
            stats.received += result.nbytes
            target = direct_target(outs, weight.dtype, weight.size) if meta is not None else None
            if target is not None and is_device_array(target):
                # the server's compressed payload, decoded on the device into the (first) output
                decode_into(result, meta, weight.size, weight.dtype, target)
                write_out(k, target, outs[1:])
                continue
            if meta is not None:  # the server's compressed payload
                result = gc_decode(result, meta, weight.size, weight.dtype)
            write_out(k, result, outs)
        return out

    def pushpull(self, key: Key | Sequence[Key], value: Any, out: Any = None) -> Any:
        self.push(key, value)
        return self.pull(key, value if out is None else out)

    def set_optimizer(self, optimizer: Any, **kwargs: Any) -> None:
        self.store.set_optimizer(to_spec(optimizer, **kwargs))

    def set_gradient_compression(self, params: Any) -> None:
        active = resolve_compression(params)
        self.compression = validate_params(params)
        self.codec.set_params(active)
        self.store.set_compression(active)

    def wire_stats(self) -> dict[str, int]:
        """Bytes that a worker of a ``dist`` job would have sent and received (see ``compression.codec``)."""
        return self.codec.stats.as_dict()

    def compression_state(self) -> dict[str, dict[str, Any]]:
        """The worker-side residuals by ``"<key>/0"``."""
        return self.codec.state()

    def load_compression_state(self, state: dict[str, dict[str, Any]]) -> None:
        self.codec.load_state(state, {str(k): k for k in self.shapes})

    def server_state(self) -> dict[Key, dict[str, Any]]:
        """The "server side" of every key, as ``DistKVStore.server_state`` (one part, index 0):
        ``value`` and ``opt/<slot>`` arrays in the key's shape, ``opt/t`` an int,
        ``pull/0/<slot>`` the pull compressor's state."""
        entries, arrays, slots, scalars = self.store.get_state()
        out: dict[Key, dict[str, Any]] = {}
        for e, arr, slot in zip(entries, arrays, slots, strict=True):
            group, _, name = slot.partition("/")
            named = out.setdefault(e.key, {})
            if group == "pull":
                named[f"pull/0/{name}"] = arr
            else:
                named[slot] = arr.reshape(self.shapes[e.key])
        for k, _part, slot, number in scalars:
            out.setdefault(k, {})[slot] = number
        return out

    def load_server_state(self, state: dict[Key, dict[str, Any]]) -> None:
        """Restore ``server_state()`` (after ``set_optimizer``, ``set_gradient_compression`` and
        ``init``); every key is checked before any is changed (``Store.set_state``)."""
        entries: list[protocol.Entry] = []
        arrays: list[np.ndarray] = []
        slots: list[str] = []
        scalars: list[tuple[Key, int, str, int | float]] = []
        for k, named in state.items():
            check_key(k)
            for name, value in named.items():
                if name.startswith("pull/"):
                    part, _, slot = name[5:].partition("/")
                    if part != "0":
                        raise KVError(f"key {k!r}: state slot {name!r} does not fit this store (one part)")
                    name = f"pull/{slot}"
                if isinstance(value, int | np.integer) and not isinstance(value, bool):
                    scalars.append((k, 0, name, int(value)))
                    continue
                arr = np.ascontiguousarray(to_host(value)).reshape(-1)
                entries.append(protocol.Entry(k, 0, arr.size, arr.dtype.str))
                arrays.append(arr)
                slots.append(name)
        self.store.set_state(tuple(entries), arrays, slots, scalars)
