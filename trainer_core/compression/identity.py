"""``none``: no compression; the payload is the gradient's own bytes (the 32-bit baseline).

Payload: the ``n`` values in the gradient's dtype, little-endian, C order. The residual stays zero.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import Compressor


class Identity(Compressor):
    """The uncompressed baseline, so callers can treat every key alike."""

    name: ClassVar[str] = "none"
    stateful: ClassVar[bool] = False

    def wire_bytes(self, size: int, dtype: Any = np.float32, shape: Any = None) -> int:
        return size * np.dtype(dtype).itemsize

    def _encode(self, xp: Any, g: Any, r: Any, dtype: np.dtype) -> tuple[Any, dict[str, Any]]:
        return g.astype(dtype.newbyteorder("<")).view(np.uint8), {}

    def _decode(self, xp: Any, buf: Any, meta: dict[str, Any], n: int, dtype: np.dtype, out: Any) -> Any:
        if buf.size != n * dtype.itemsize:
            raise ValueError(f"payload of {buf.size} bytes does not hold {n} x {dtype}")
        return buf.view(dtype.newbyteorder("<")).astype(dtype)
