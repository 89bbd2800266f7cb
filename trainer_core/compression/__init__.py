"""Gradient compression: a registry of compressors by name, MXNet-style params.

>>> c = get_compressor({"type": "2bit", "threshold": 0.5})   # one object per key
>>> payload, meta = c.encode(grad)                           # uint8 array + plain dict
>>> g_hat = c.decode(payload, meta, grad.shape, grad.dtype)  # or decode(payload, meta, ...)

Compressors: ``none`` (baseline), ``2bit`` (MXNet's threshold quantizer), ``1bit`` (CNTK's 1-bit
SGD, per-block reconstruction values), ``topk`` (top-k sparsification) and ``powersgd`` (rank-r
approximation). All but ``none`` keep an error-feedback residual per key. Every compressor also takes ``kernel``: ``'auto'`` (numba when
installed, for host float32/float64 arrays), ``'numpy'`` (the array-module path, also the one
that runs on cupy) or ``'numba'``. The packed layouts are documented in ``docs/wire.md``.

A new compressor is one module with a ``Compressor`` subclass plus one line in ``REGISTRY``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import KERNELS, Compressor
from .identity import Identity
from .onebit import OneBit
from .powersgd import PowerSGD
from .topk import TopK
from .twobit import TwoBit

__all__ = ["REGISTRY", "Compressor", "available", "decode", "decode_sum", "get_compressor", "ratio"]

REGISTRY: dict[str, type[Compressor]] = {
    Identity.name: Identity,
    TwoBit.name: TwoBit,
    OneBit.name: OneBit,
    TopK.name: TopK,
    PowerSGD.name: PowerSGD,
}


def available() -> list[str]:
    """The registered compressor names."""
    return sorted(REGISTRY)


def get_compressor(params: dict[str, Any] | None) -> Compressor:
    """A fresh compressor (with an empty residual) from MXNet-style ``params``.

    ``params`` is ``{'type': NAME, ...}`` with the type's own parameters (``threshold`` for 2bit,
    ``block_size`` for 1bit, ``ratio`` for topk, ``rank`` and ``seed`` for powersgd) and
    optionally ``kernel``; ``None`` means
    ``{'type': 'none'}``. Raises ValueError for an unknown type or parameter, or a bad value.
    """
    if params is None:
        params = {"type": "none"}
    if not isinstance(params, dict):
        raise ValueError(f"compression params must be a dict like {{'type': '2bit'}}, got {params!r}")
    if "type" not in params:
        raise ValueError(f"compression params need a 'type' (one of {available()}), got {params!r}")
    name = params["type"]
    cls = REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown compression type {name!r}; known: {available()}")
    kwargs = {k: v for k, v in params.items() if k != "type"}
    unknown = sorted(set(kwargs) - set(cls.param_names) - {"kernel"})
    if unknown:
        allowed = sorted((*cls.param_names, "kernel"))
        raise ValueError(f"compression {name!r} has no parameter(s) {unknown}; allowed: {allowed}")
    if "kernel" in kwargs and kwargs["kernel"] not in KERNELS:
        raise ValueError(f"compression kernel must be one of {KERNELS}, got {kwargs['kernel']!r}")
    return cls(**kwargs)


def decode(payload: Any, meta: dict[str, Any], shape: Any, dtype: Any, out: Any = None) -> Any:
    """Decode any payload by its ``meta['type']`` (decoding needs no per-key state)."""
    name = meta.get("type")
    cls = REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown compression type {name!r} in payload metadata")
    return _decoders(cls).decode(payload, meta, shape, dtype, out)


def decode_sum(
    payloads: Sequence[tuple[Any, dict[str, Any]]], n: int, dtype: Any, out: Any, scratch: Any = None
) -> Any:
    """Decode ``payloads`` (pairs of payload and metadata, all of one type) and add them in their
    order into ``out`` (flat, ``n`` values of ``dtype``): ``Compressor.decode_sum``."""
    names = sorted({str(meta.get("type")) for _, meta in payloads})
    if len(names) != 1:
        raise ValueError(f"decode_sum adds one or more payloads of one type, not of {names}")
    cls = REGISTRY.get(names[0])
    if cls is None:
        raise ValueError(f"unknown compression type {names[0]!r} in payload metadata")
    return _decoders(cls).decode_sum(payloads, n, dtype, out, scratch)


_DECODERS: dict[type[Compressor], Compressor] = {}


def _decoders(cls: type[Compressor]) -> Compressor:
    if cls not in _DECODERS:
        _DECODERS[cls] = cls()
    return _DECODERS[cls]


def ratio(params: dict[str, Any] | None, size: int, dtype: Any = np.float32, shape: Any = None) -> float:
    """How many times smaller than the raw array the payload is, for ``size`` values."""
    raw = size * np.dtype(dtype).itemsize
    return raw / max(1, get_compressor(params).wire_bytes(size, dtype, shape))
