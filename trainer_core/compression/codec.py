"""The gradient-compression hook of the KV store.

``set_gradient_compression(params)`` on a worker validates ``params`` here, keeps them, and
forwards them (plain data) to every server, which validates them again. ``{"type": "none"}``
turns compression off; any other type is looked up in ``trainer_core.compression``'s registry
(``get_compressor(params)``), and an unknown type or parameter is refused with
``CompressionError``.

Where compression plugs in (float16/32/64 keys only; other dtypes always travel raw):

* push: the worker encodes each key part with that part's own compressor (its error-feedback
  residual, ``WorkerCodec``; a cupy part is encoded on its device, and only the payload is copied
  to the host, ``xp.payload_to_host``) and sends the packed payload as a data frame whose entry carries the
  payload's metadata, a plain dict (the wire's ``Entry.comp``); the server decodes it (decoding is
  stateless) before summing. This module uses only the base modules: the layers pass it plain
  data, and the wire only bounds the metadata (``wire.payload_meta``).
* pull: the server encodes each new value of a key part once, with that part's own compressor
  (the server's residual, ``ServerCodec``), and sends the same payload to every worker that pulls
  that value (so all workers decode identical values); the reply's body lists each frame's
  metadata (``"c"``). The worker decodes.

Compressed parts always travel as socket frames, never through shared memory, so the bytes
counted are the bytes that crossed a socket. ``WorkerCodec`` counts every data byte a worker
sends and receives (compressed payloads, raw frames and raw shared-memory parts alike), which
is what ``DistKVStore.wire_stats()`` reports.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import trainer_core.xp as arrays
from trainer_core.errors import CompressionError

#: dtypes whose parts are compressed (the compressors' float types).
COMPRESSIBLE = frozenset({"<f2", "<f4", "<f8"})


def validate_params(params: Any) -> dict[str, Any]:
    """A plain-data copy of ``params`` with a string ``type``; ``CompressionError`` otherwise."""
    if not isinstance(params, Mapping):
        raise CompressionError(f"gradient compression params must be a dict, got {type(params).__name__}")
    kind = params.get("type")
    if not isinstance(kind, str) or not kind:
        raise CompressionError(
            "gradient compression params need a 'type' (e.g. {'type': '2bit', 'threshold': 0.5})"
        )
    out: dict[str, Any] = {}
    for k, v in params.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, str | int | float | bool)):
            raise CompressionError(
                f"gradient compression parameter {k!r}={v!r}: only plain scalars are allowed"
            )
        out[k] = v
    return out


def _registry() -> Any:
    return importlib.import_module("trainer_core.compression")


def _kernels() -> Any:
    return importlib.import_module("trainer_core.compression.kernels")


def resolve_compression(params: Any) -> dict[str, Any] | None:
    """The validated params (``None`` for type ``none``), or ``CompressionError`` for params the
    registry refuses."""
    p = validate_params(params)
    if p["type"].lower() == "none":
        return None
    try:
        _registry().get_compressor(p)
    except (KeyError, ValueError, TypeError) as exc:
        # the registry's message names what is wrong: the type, a parameter, or its value
        raise CompressionError(f"gradient compression {p!r} refused: {exc}") from None
    return p


def agreed_compression(active: dict[str, Any] | None) -> dict[str, Any]:
    """What the workers of a job must agree on for resolved params ``active`` (``resolve_compression``):
    the type and every parameter, defaults filled in (``{'type': '2bit'}`` is
    ``{'type': '2bit', 'threshold': 0.5}``), without ``kernel`` (each machine may run its own: they
    write the same bytes); ``{'type': 'none'}`` when off."""
    if active is None:
        return {"type": "none"}
    params: dict[str, Any] = _registry().get_compressor(active).params()
    return params


def compressible(dtype: str | np.dtype) -> bool:
    """Whether parts of ``dtype`` are compressed."""
    return np.dtype(dtype).str in COMPRESSIBLE


def check_meta(meta: Any) -> dict[str, Any]:
    """A payload's metadata as received (the wire carries it as plain scalars, see docs/wire.md):
    at most 16 plain scalars with a string ``type``; ``CompressionError`` otherwise."""
    if not isinstance(meta, Mapping) or not isinstance(meta.get("type"), str) or len(meta) > 16:
        raise CompressionError("bad compression metadata")
    for k, v in meta.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, str | int | float | bool)):
            raise CompressionError("bad compression metadata")
    return dict(meta)


def decode(payload: Any, meta: Any, size: int, dtype: Any, out: Any = None) -> Any:
    """Decode a received payload into a flat array of ``size`` values of ``dtype``; with ``out`` (a
    flat C-contiguous array of those, on the host or a device) into ``out``: for a device ``out``,
    on its device after one copy of the payload (not the values) up."""
    m = check_meta(meta)
    buf = np.frombuffer(payload, dtype=np.uint8)
    if out is not None and arrays.is_device_array(out):
        buf = arrays.payload_to_device(buf, out)
    try:
        out = _registry().decode(buf, m, (size,), np.dtype(dtype), out=out)
    except KeyError as exc:  # a parameter the compressor needs is not in the metadata
        raise CompressionError(f"cannot decode a {m['type']} payload: its metadata lacks {exc}") from None
    except (ValueError, TypeError, IndexError) as exc:
        raise CompressionError(f"cannot decode a {m['type']} payload: {exc}") from None
    return out.reshape(-1)


def decode_sum(items: Sequence[tuple[Any, Any]], size: int, dtype: Any, out: Any, scratch: Any = None) -> Any:
    """``out`` (flat, ``size`` values of ``dtype``) becomes the sum of the received payloads
    ``items`` (pairs of payload and metadata, of one type), decoded and added in their order
    (``Compressor.decode_sum``: the bits of ``decode`` of each and the array module's adds);
    ``CompressionError`` as ``decode``."""
    pairs = [(np.frombuffer(p, dtype=np.uint8), check_meta(m)) for p, m in items]
    kind = pairs[0][1]["type"] if pairs else "none"
    try:
        out = _registry().decode_sum(pairs, size, np.dtype(dtype), out, scratch)
    except KeyError as exc:  # a parameter the compressor needs is not in the metadata
        raise CompressionError(f"cannot decode a {kind} payload: its metadata lacks {exc}") from None
    except (ValueError, TypeError, IndexError) as exc:
        raise CompressionError(f"cannot decode {kind} payloads: {exc}") from None
    return out.reshape(-1)


@dataclass
class WireStats:
    """Data bytes one worker sent and received (payloads or raw parts; headers not counted)."""

    sent: int = 0
    received: int = 0
    raw_sent: int = 0
    raw_received: int = 0
    exchanges: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "sent": self.sent,
            "received": self.received,
            "raw_sent": self.raw_sent,
            "raw_received": self.raw_received,
            "exchanges": self.exchanges,
        }


@dataclass
class WorkerCodec:
    """A worker's compressors, one per key part (``(key, part)``), and its byte counters."""

    params: dict[str, Any] | None = None
    parts: dict[tuple[Any, int], Any] = field(default_factory=dict)
    stats: WireStats = field(default_factory=WireStats)

    def set_params(self, params: dict[str, Any] | None) -> None:
        """New params: every residual starts from zero; the kernels are made ready now (compiled
        or loaded from the cache, see ``kernels.warm``) rather than in the first push."""
        self.params = params
        self.parts.clear()
        _kernels().warm(params)

    def active(self, dtype: Any) -> bool:
        return self.params is not None and compressible(dtype)

    def encode(self, key: Any, part: int, data: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """The payload and metadata of one part (residual kept per part)."""
        comp = self.parts.get((key, part))
        if comp is None:
            comp = self.parts[(key, part)] = _registry().get_compressor(self.params)
        payload, meta = comp.encode(data)
        return arrays.payload_to_host(payload), meta  # a device payload: one copy, at its size

    def state(self) -> dict[str, dict[str, np.ndarray]]:
        """Residuals by ``"<key>/<part>"`` (for checkpoints)."""
        return {f"{k}/{p}": c.state_dict() for (k, p), c in self.parts.items() if c.state_dict()}

    def load_state(self, state: Mapping[str, Mapping[str, np.ndarray]], keys: Mapping[str, Any]) -> None:
        """Restore ``state()``; ``keys`` maps each key's string form back to the key."""
        for name, st in state.items():
            kname, _, part = name.rpartition("/")
            comp = _registry().get_compressor(self.params)
            comp.load_state_dict(dict(st))
            self.parts[(keys[kname], int(part))] = comp


@dataclass
class ServerCodec:
    """A server's compressors for pulls: one per key part, each value version encoded once."""

    params: dict[str, Any] | None = None
    parts: dict[Any, Any] = field(default_factory=dict)
    cache: dict[Any, tuple[int, np.ndarray, dict[str, Any]]] = field(default_factory=dict)

    def set_params(self, params: dict[str, Any] | None) -> None:
        """New params (kernels made ready now, as for a worker)."""
        self.params = params
        self.parts.clear()
        self.cache.clear()
        _kernels().warm(params)

    def active(self, dtype: Any) -> bool:
        return self.params is not None and compressible(dtype)

    def encode(self, kid: Any, version: int, value: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """The payload of ``value`` (version ``version`` of key part ``kid``), encoded once."""
        hit = self.cache.get(kid)
        if hit is not None and hit[0] == version:
            return hit[1], hit[2]
        comp = self.parts.get(kid)
        if comp is None:
            comp = self.parts[kid] = _registry().get_compressor(self.params)
        payload, meta = comp.encode(value)
        payload = np.ascontiguousarray(payload).view(np.uint8).reshape(-1)
        self.cache[kid] = (version, payload, meta)
        return payload, meta

    def load_part(self, kid: Any, state: Mapping[str, np.ndarray]) -> None:
        """Restore one part's compressor state (empty: a fresh compressor); drops its cached payload."""
        self.cache.pop(kid, None)
        self.parts.pop(kid, None)
        if self.params is not None and state:
            comp = _registry().get_compressor(self.params)
            comp.load_state_dict(dict(state))
            self.parts[kid] = comp
