"""The compressor base class: one object per key, holding that key's error-feedback residual.

A compressor turns a gradient into a packed payload (a 1-D ``uint8`` array, bytes-like on the host)
plus a small metadata dict of plain ints, floats and strings, and back. The base class owns the
orchestration (dtype checks, flattening, the residual, the byte count); a subclass fills in two
hooks that work on flat arrays:

* ``_encode(xp, g, r, dtype)``: ``g`` is the flat gradient, ``r`` the flat residual buffer in the
  work dtype; the hook forms ``v = g + r``, returns ``(payload, meta)`` and leaves in ``r`` exactly
  what the payload did not carry (the new residual). Kernels fuse the add with the quantizer.
* ``_decode(xp, buf, meta, n, dtype, out)``: rebuild ``n`` values of ``dtype`` from the payload
  (into the flat ``out`` when given and the kernel can).

Invariant (tested): ``decode(encode(g)) + new_residual == g + old_residual`` to float tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from trainer_core.xp import array_module, is_device_array, like, to_host

#: Gradient dtypes a compressor accepts.
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

KERNELS = ("auto", "numpy", "numba")


def work_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype the residual is kept in: float64 for float64 gradients, float32 otherwise."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def check_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a numpy dtype, or TypeError when it is not a supported float type."""
    dt = np.dtype(dtype)
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"gradient compression supports float16/32/64, not {dt}")
    return dt


def as_payload(payload: Any) -> Any:
    """A 1-D uint8 view of a payload given as an array, bytes, bytearray or memoryview."""
    if is_device_array(payload):
        return payload.reshape(-1).view(np.uint8)
    arr = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, dtype=np.uint8)
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


class Compressor:
    """Base class. Subclasses set ``name`` and implement ``_encode``, ``_decode`` and ``wire_bytes``."""

    name: ClassVar[str] = ""
    #: Parameter names accepted by ``get_compressor`` besides ``type`` and ``kernel``.
    param_names: ClassVar[tuple[str, ...]] = ()
    #: False for compressors that lose nothing and so keep no residual.
    stateful: ClassVar[bool] = True

    def __init__(self, kernel: str = "auto") -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
        if kernel == "numba":
            from . import _fast

            if not _fast.available():
                raise ValueError("kernel 'numba' asked for but numba cannot be imported (pip install numba)")
        self.kernel = kernel
        self.residual: Any = None
        #: payload bytes of the last ``encode`` (metadata not counted).
        self.last_wire_bytes = 0

    # -- public API -------------------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        """The MXNet-style params dict that rebuilds this compressor with ``get_compressor``."""
        return {"type": self.name, **{k: getattr(self, k) for k in self.param_names}}

    def wire_bytes(self, size: int, dtype: Any = np.float32, shape: Any = None) -> int:
        """Payload bytes for a gradient of ``size`` elements of ``dtype`` (and ``shape``, which only
        ``powersgd`` needs)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the residual (the next encode starts from zero error)."""
        self.residual = None

    def load_residual(self, residual: Any) -> None:
        """Set the residual (a flat array in the work dtype), e.g. when resuming from a checkpoint."""
        self.residual = residual.reshape(-1).copy()

    def state_dict(self) -> dict[str, Any]:
        """The per-key state to checkpoint, as named arrays (empty before the first encode)."""
        return {} if self.residual is None else {"residual": self.residual.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; the next encode continues where it stopped."""
        self.reset()
        if "residual" in state:
            self.load_residual(state["residual"])

    def encode(self, grad: Any, plus: Any = None, into: Any = None) -> tuple[Any, dict[str, Any]]:
        """Compress ``grad`` (with the residual added in), keep what was lost as the new residual.

        ``plus`` (an array of ``grad``'s size and dtype, on its device) is added to ``grad`` first,
        in their dtype: the payload and residual are those of encoding ``grad + plus``. Where
        ``encodes_sum(grad)``, a kernel reads both and never forms the sum; else it is formed first
        (a fresh array). ``into`` (a host uint8 array of at least ``wire_bytes`` bytes, reused by
        the caller from one call to the next): where the compressor's host kernel can, the payload
        is written there and returned as a view of it (no fresh payload to fault in); else it is
        ignored."""
        xp = array_module(grad)
        dtype = check_dtype(grad.dtype)
        flat = xp.ascontiguousarray(grad).reshape(-1)
        more = None
        if plus is not None:
            more = xp.ascontiguousarray(plus).reshape(-1)
            if more.dtype != flat.dtype or more.size != flat.size or array_module(more) is not xp:
                raise ValueError(
                    f"{self.name}: plus ({more.size} x {more.dtype}) must be like the gradient "
                    f"({flat.size} x {flat.dtype}, on its device)"
                )
            if not self.stateful or not self.encodes_sum(flat):
                flat, more = xp.add(flat, more), None
        if not self.stateful:
            payload, meta = self._encode(xp, flat, None, dtype)
            self.last_wire_bytes = int(payload.nbytes)
            return payload, {"type": self.name, **meta}
        res = self._residual_for(xp, flat.size, dtype, "gradient", follow=flat)
        if more is None:
            payload, meta = (
                self._encode(xp, flat, res, dtype)
                if into is None
                else self._encode_into(xp, flat, res, dtype, into)
            )
        else:
            payload, meta = self._encode_sum(flat, more, res, dtype, into)
        self.last_wire_bytes = int(payload.nbytes)
        return payload, {"type": self.name, **meta}

    def encode_payload_sum(
        self,
        payloads: Sequence[tuple[Any, dict[str, Any]]],
        n: int,
        dtype: Any,
        divisor: int = 1,
        into: Any = None,
        scratch: Any = None,
    ) -> tuple[Any, dict[str, Any]]:
        """``encode`` of ``decode_sum(payloads, n, dtype)`` divided by ``divisor`` (``numpy.divide``
        in ``dtype``; not at all when it is 1): the same payload and residual, for a compressor
        whose ``encodes_payload_sum(payloads, dtype)`` says its kernel does it without writing
        that sum (four blocks at a time in cache: the compressed allreduce's second stage encodes
        the sum of its chunk's payloads so). ``into``: as for ``encode``; ``scratch`` (a host array)
        may hold the kernel's copy of the payloads' rows."""
        if not self.encodes_payload_sum(payloads, dtype):
            raise ValueError(f"{self.name}: encode_payload_sum has no kernel for these payloads")
        dt = check_dtype(dtype)
        bufs = [as_payload(p) for p, _ in payloads]
        res = self._residual_for(np, n, dt, "a sum")
        metas = [meta for _, meta in payloads]
        payload, meta = self._encode_payload_sum(bufs, metas, n, dt, divisor, res, into, scratch)
        self.last_wire_bytes = int(payload.nbytes)
        return payload, {"type": self.name, **meta}

    def _residual_for(self, xp: Any, n: int, dtype: np.dtype, what: str, follow: Any = None) -> Any:
        """The residual that an encoding of ``n`` values of ``dtype`` in array module ``xp`` adds
        in: zeros on the first; where a checkpoint loaded it on the host and ``follow`` (the array
        being encoded) is on a device, moved there once; ``ValueError`` (naming ``what`` was
        encoded) where it is another key's."""
        wdt = work_dtype(dtype)
        res = self.residual
        if res is None:
            res = self.residual = xp.zeros(n, dtype=wdt)
        elif follow is not None and array_module(res) is not xp and res.size == n and res.dtype == wdt:
            # a residual loaded from a checkpoint is a host array: it follows the gradient, once
            res = self.residual = like(to_host(res), follow)
        elif res.size != n or res.dtype != wdt or array_module(res) is not xp:
            raise ValueError(
                f"{self.name}: {what} of {n} x {dtype} does not match the residual of "
                f"{res.size} x {res.dtype}; use one compressor per key (or reset())"
            )
        return res

    def encodes_payload_sum(self, payloads: Sequence[tuple[Any, dict[str, Any]]], dtype: Any) -> bool:
        """Whether ``encode_payload_sum`` runs for these payloads (False: none of this class)."""
        return False

    def _encode_payload_sum(
        self,
        bufs: list[Any],
        metas: list[dict[str, Any]],
        n: int,
        dtype: np.dtype,
        divisor: int,
        r: Any,
        into: Any,
        scratch: Any,
    ) -> tuple[Any, dict[str, Any]]:
        """The kernel of ``encode_payload_sum`` (``r``: the residual), for a subclass whose
        ``encodes_payload_sum`` says it can."""
        raise NotImplementedError

    def encodes_sum(self, grad: Any) -> bool:
        """Whether ``encode(grad, plus)`` runs a kernel that reads ``grad`` and ``plus`` without
        forming their sum (False: the sum is formed first, in a fresh array)."""
        return False

    def decode(self, payload: Any, meta: dict[str, Any], shape: Any, dtype: Any, out: Any = None) -> Any:
        """Rebuild an array of ``shape`` and ``dtype`` from ``payload`` and ``meta``.

        ``out``, if given, is a C-contiguous array of that size and dtype (on the payload's device)
        that receives the values and is returned.
        """
        if meta.get("type") != self.name:
            raise ValueError(f"{self.name} cannot decode a payload of type {meta.get('type')!r}")
        dt = check_dtype(dtype)
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        n = math.prod(shape)
        buf = as_payload(payload)
        xp = array_module(buf)
        flat = None
        if out is not None:
            if out.size != n or out.dtype != dt or not out.flags.c_contiguous:
                raise ValueError(f"out must be a C-contiguous {dt} array of {n} values")
            flat = out.reshape(-1)
        result = self._decode(xp, buf, meta, n, dt, flat)
        if flat is None:
            return result.reshape(shape)
        if result is not flat:
            flat[...] = result
        return out.reshape(shape)

    def decode_sum(
        self,
        payloads: Sequence[tuple[Any, dict[str, Any]]],
        n: int,
        dtype: Any,
        out: Any,
        scratch: Any = None,
    ) -> Any:
        """``out`` (a flat C-contiguous array of ``n`` values of ``dtype``) becomes the sum of the
        decoded ``payloads`` (pairs of payload and metadata, at least one), added in their order in
        ``dtype``: ``((d0 + d1) + d2) ...``, the same bits as decoding each and adding them with the
        array module's ``add``. A kernel may do it in one pass (``_decode_sum``, which may use
        ``scratch`` as working memory); else every payload after the first is decoded into
        ``scratch`` (like ``out``; a fresh array when None) and added."""
        if not payloads:
            raise ValueError("decode_sum needs at least one payload")
        metas = [meta for _, meta in payloads]
        for meta in metas:
            if meta.get("type") != self.name:
                raise ValueError(f"{self.name} cannot decode a payload of type {meta.get('type')!r}")
        dt = check_dtype(dtype)
        if out.size != n or out.dtype != dt or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {dt} array of {n} values")
        flat = out.reshape(-1)
        bufs = [as_payload(p) for p, _ in payloads]
        if len(bufs) > 1 and self._decode_sum(bufs, metas, n, dt, flat, scratch):
            return out
        self.decode(bufs[0], metas[0], n, dt, flat)
        if len(bufs) > 1:
            xp = array_module(flat)
            tmp = xp.empty_like(flat) if scratch is None else scratch
            for buf, meta in zip(bufs[1:], metas[1:], strict=True):
                xp.add(flat, self.decode(buf, meta, n, dt, tmp), out=flat)
        return out

    # -- hooks ------------------------------------------------------------------------------
    def use_fast(self, x: Any, dtype: np.dtype) -> bool:
        """True when the numba kernel should run: host arrays of float32/float64 with numba present."""
        if self.kernel == "numpy" or is_device_array(x) or dtype == np.float16:
            return False
        from . import _fast, kernels

        if not kernels._announced and not kernels._warming:
            kernels.announce()
        return _fast.available()

    def _encode(self, xp: Any, g: Any, r: Any, dtype: np.dtype) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError

    def _encode_into(self, xp: Any, g: Any, r: Any, dtype: np.dtype, into: Any) -> tuple[Any, dict[str, Any]]:
        """``_encode``, the payload written into ``into`` where the subclass can (this default:
        ``_encode`` itself, ``into`` ignored)."""
        return self._encode(xp, g, r, dtype)

    def _encode_sum(
        self, g: Any, g2: Any, r: Any, dtype: np.dtype, into: Any = None
    ) -> tuple[Any, dict[str, Any]]:
        """``_encode`` of ``g + g2``, for a subclass whose ``encodes_sum`` says it can (``into``:
        as for ``_encode_into``)."""
        raise NotImplementedError

    def _decode(self, xp: Any, buf: Any, meta: dict[str, Any], n: int, dtype: np.dtype, out: Any) -> Any:
        """Return the n values; a kernel may write them straight into ``out`` when it is not None."""
        raise NotImplementedError

    def _decode_sum(
        self, bufs: list[Any], metas: list[dict[str, Any]], n: int, dtype: np.dtype, out: Any, scratch: Any
    ) -> bool:
        """Write into ``out`` the sum of the decoded ``bufs`` (see ``decode_sum``) in one pass and
        return True, or return False where there is no such kernel for them (``scratch``, like
        ``out`` or None, is the kernel's to use as working memory)."""
        return False


def param_error(name: str, key: str, value: Any, want: str) -> ValueError:
    return ValueError(f"compression {name!r}: parameter {key!r} must be {want}, got {value!r}")
