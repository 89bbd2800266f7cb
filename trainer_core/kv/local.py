"""The one-process store (``local``, ``device``): the sums, compression and optimizer of a server, in process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainer_core.compression.codec import ServerCodec, WorkerCodec, resolve_compression, validate_params
from trainer_core.compression.codec import decode as gc_decode
from trainer_core.errors import KVError
from trainer_core.kv.api import KVStore, check_key, host_sum, normalize, write_out
from trainer_core.optim.server import Updater, build, to_spec
from trainer_core.transport.wire import Key
from trainer_core.xp import to_host


class LocalKVStore(KVStore):
    """``local``/``device``: one process; push sums a key's values, then applies the optimizer or stores the sum.

    With gradient compression on, a push goes through the worker's encode and decode (its residual)
    and a pull through the server's (one residual per key), exactly as in a ``dist`` job with one
    worker: the single-process reference for compressed training."""

    def __init__(self, name: str = "local") -> None:
        self.type = name
        self.values: dict[Key, np.ndarray] = {}
        self.shapes: dict[Key, tuple[int, ...]] = {}
        self.updater: Updater | None = None
        self.states: dict[Key, dict[str, Any]] = {}
        self.compression: dict[str, Any] | None = None
        self.codec = WorkerCodec()
        self.server_codec = ServerCodec()
        self.versions: dict[Key, int] = {}

    def init(self, key: Key | Sequence[Key], value: Any) -> None:
        for k, vals in normalize(key, value):
            host = to_host(vals[0])
            self.values[k] = np.array(host, copy=True).reshape(-1)
            self.shapes[k] = host.shape
            self.versions[k] = self.versions.get(k, 0) + 1

    def _get(self, key: Key) -> np.ndarray:
        try:
            return self.values[key]
        except KeyError:
            raise KVError(f"key {key!r} was not initialized") from None

    def push(self, key: Key | Sequence[Key], value: Any) -> None:
        for k, vals in normalize(key, value):
            weight = self._get(k)
            grad = host_sum(vals, weight.dtype)
            if grad.size != weight.size:
                raise KVError(f"key {k!r}: pushed {grad.size} elements, stored {weight.size}")
            stats = self.codec.stats
            stats.raw_sent += grad.nbytes
            if self.codec.active(grad.dtype):
                payload, meta = self.codec.encode(k, 0, grad)
                stats.sent += payload.nbytes
                grad = gc_decode(payload, meta, grad.size, grad.dtype)
            else:
                stats.sent += grad.nbytes
            self.versions[k] += 1
            if self.updater is None:
                np.copyto(weight, grad)
            else:
                state = self.states.get(k)
                if state is None:
                    state = self.states[k] = self.updater.create_state(weight)
                self.updater.update(weight, grad, state)

    def pull(self, key: Key | Sequence[Key], out: Any) -> Any:
        for k, outs in normalize(key, out):
            value = self._get(k)
            stats = self.codec.stats
            stats.raw_received += value.nbytes
            if self.server_codec.active(value.dtype):
                payload, meta = self.server_codec.encode(k, self.versions[k], value)
                stats.received += payload.nbytes
                value = gc_decode(payload, meta, value.size, value.dtype)
            else:
                stats.received += value.nbytes
            write_out(value, outs)
        return out

    def pushpull(self, key: Key | Sequence[Key], value: Any, out: Any = None) -> Any:
        self.push(key, value)
        return self.pull(key, value if out is None else out)

    def set_optimizer(self, optimizer: Any, **kwargs: Any) -> None:
        self.updater = build(to_spec(optimizer, **kwargs))
        self.states.clear()

    def set_gradient_compression(self, params: Any) -> None:
        active = resolve_compression(params)
        self.compression = validate_params(params)
        self.codec.set_params(active)
        self.server_codec.set_params(active)

    def wire_stats(self) -> dict[str, int]:
        """Bytes that a worker of a ``dist`` job would have sent and received (see ``gc_hook``)."""
        return self.codec.stats.as_dict()

    def compression_state(self) -> dict[str, dict[str, Any]]:
        """The worker-side residuals by ``"<key>/0"``."""
        return self.codec.state()

    def load_compression_state(self, state: dict[str, dict[str, Any]]) -> None:
        self.codec.load_state(state, {str(k): k for k in self.values})

    def server_state(self) -> dict[Key, dict[str, Any]]:
        """The "server side" of every key, as ``DistKVStore.server_state`` (one part, index 0)."""
        out: dict[Key, dict[str, Any]] = {}
        for k, value in self.values.items():
            state: dict[str, Any] = {"value": value.reshape(self.shapes[k]).copy()}
            for name, v in (self.states.get(k) or {}).items():
                state[f"opt/{name}"] = v.reshape(self.shapes[k]).copy() if isinstance(v, np.ndarray) else v
            comp = self.server_codec.parts.get(k)
            for name, v in (comp.state_dict() if comp is not None else {}).items():
                state[f"pull/0/{name}"] = np.array(v, copy=True)
            out[k] = state
        return out

    def load_server_state(self, state: dict[Key, dict[str, Any]]) -> None:
        """Restore ``server_state()`` (after ``set_optimizer``, ``set_gradient_compression`` and ``init``);
        every key is checked before any is changed."""
        plans = []
        for k, slots in state.items():
            weight = self._get(check_key(k))
            value: np.ndarray | None = None
            opt = self.updater.create_state(weight) if self.updater is not None else {}
            given_opt = False
            pull: dict[str, np.ndarray] = {}
            for name, v in slots.items():
                if name == "value":
                    value = to_host(v).reshape(-1)
                    if value.size != weight.size:
                        raise KVError(
                            f"key {k!r}: state value has {value.size} elements, the key {weight.size}"
                        )
                elif name.startswith("opt/") and isinstance(opt.get(name[4:]), np.ndarray):
                    arr = to_host(v).reshape(-1)
                    if arr.size != weight.size:
                        raise KVError(
                            f"key {k!r}: state {name!r} has {arr.size} elements, the key {weight.size}"
                        )
                    np.copyto(opt[name[4:]], arr)
                    given_opt = True
                elif name.startswith("opt/") and name[4:] in opt:
                    opt[name[4:]], given_opt = int(v), True
                elif name.startswith("pull/0/") and self.server_codec.active(weight.dtype):
                    pull[name[7:]] = to_host(v)
                else:
                    raise KVError(f"key {k!r}: state slot {name!r} does not fit this store's setup")
            plans.append((k, weight, value, opt if given_opt else None, pull))
        for k, weight, value, opt_state, pull in plans:
            if value is not None:
                np.copyto(weight, value)
            self.versions[k] += 1
            self.states.pop(k, None)
            if opt_state is not None:
                self.states[k] = opt_state
            self.server_codec.load_part(k, pull)
