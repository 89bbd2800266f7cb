"""The gradient-compression hook of the KV store.

``set_gradient_compression(params)`` on a worker validates ``params`` here, keeps them, and
forwards them (plain data) to every server, which validates them again. ``{"type": "none"}``
turns compression off. Any other type is looked up in ``trainer_core.compression``'s
registry (``get_compressor(params)``); until a compressor is registered there, every other
type is refused with ``CompressionError`` naming it.

Where compression plugs in: a compressor returned by the registry is used on push (the worker
encodes each key part, the server decodes before summing) and on pull (the server may encode
the value, the worker decodes). The push/pull paths of ``kv.py`` and ``server.py`` call it only
once such a compressor exists; today ``resolve_compression`` never returns one.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from .errors import CompressionError


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


def resolve_compression(params: Any) -> Any | None:
    """The compressor for ``params`` (``None`` for type ``none``), or ``CompressionError``."""
    p = validate_params(params)
    if p["type"].lower() == "none":
        return None
    try:
        registry = importlib.import_module("trainer_core.compression")
        get_compressor = registry.get_compressor
    except (ImportError, AttributeError):
        get_compressor = None
    if get_compressor is not None:
        try:
            get_compressor(p)
        except (KeyError, ValueError) as exc:
            raise CompressionError(f"unsupported gradient compression type {p['type']!r}: {exc}") from None
    # The push/pull wire path for compressed frames is not wired yet (see the module docstring).
    raise CompressionError(
        f"unsupported gradient compression type {p['type']!r}: the KV store does not carry compressed "
        "gradients yet (only {'type': 'none'} is accepted)"
    )
