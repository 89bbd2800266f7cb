"""Non-temporal ("streaming") stores for the compiled kernels that write large arrays which are
not read again soon (a decoded result, a copy into shared memory): the bytes go to memory without
first reading each destination cache line (the read-for-ownership of an ordinary store), which
halves the memory traffic of a pure write, and they do not evict what the other processes of a
busy machine keep in cache. x86-64 only in effect: elsewhere LLVM lowers them as plain stores.

``_stream64(src, dst, start, nvec)`` is LLVM IR of its own (numba has no non-temporal store):
``nvec`` 64-byte vectors from byte ``start`` of uint8 ``src`` to the same bytes of uint8 ``dst``
(``dst``'s address + ``start`` a multiple of 64), then ``sfence``, so that the stores are
ordered before whatever the caller does next (a counter that tells another process to read).
"""

from __future__ import annotations

import platform
from typing import Any

import numpy as np

from ._fast import _helper, _jit, numba

VECTOR = 64  # bytes per non-temporal store (one cache line)
_X86 = platform.machine().lower() in ("x86_64", "amd64")


def _stream64_typer(typingctx: Any, src: Any, dst: Any, start: Any, nvec: Any) -> Any:
    arrays = (src, dst)
    if not all(isinstance(a, numba.types.Array) and a.ndim == 1 and a.layout == "C" for a in arrays):
        return None
    if src.dtype != numba.uint8 or dst.dtype != numba.uint8:
        return None
    sig = numba.types.void(src, dst, numba.intp, numba.intp)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        from llvmlite import ir
        from numba.core import cgutils

        s, d, first, count = args
        sp = context.make_array(sig.args[0])(context, builder, s).data
        dp = context.make_array(sig.args[1])(context, builder, d).data
        vec = ir.VectorType(ir.IntType(8), VECTOR)
        module = builder.module
        temporal = module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with cgutils.for_range(builder, count) as loop:
            at = builder.add(first, builder.mul(loop.index, ir.Constant(first.type, VECTOR)))
            v = builder.load(builder.bitcast(builder.gep(sp, [at]), vec.as_pointer()), align=1)
            store = builder.store(v, builder.bitcast(builder.gep(dp, [at]), vec.as_pointer()), align=VECTOR)
            store.set_metadata("nontemporal", temporal)
        if _X86:  # (a fence instruction does not order non-temporal stores there: sfence does)
            fence = cgutils.get_or_insert_function(
                module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence"
            )
            builder.call(fence, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


#: called from the kernels as ``_stream64(src, dst, start, nvec)``
_stream64: Any = None if numba is None else numba.extending.intrinsic(_stream64_typer)


@_helper
def _stream_bytes(src, dst):
    """dst[:] = src (uint8, one size): the head up to dst's next 64-byte boundary and the tail
    with plain stores, the lines between with non-temporal ones."""
    n = src.shape[0]
    head = (-dst.ctypes.data) & (VECTOR - 1)
    if head > n:
        head = n
    for k in range(head):
        dst[k] = src[k]
    nvec = (n - head) // VECTOR
    if nvec:
        _stream64(src, dst, head, nvec)
    for k in range(head + VECTOR * nvec, n):
        dst[k] = src[k]


@_jit
def stream_copy(src, dst):
    """``dst[:] = src`` for flat C-contiguous uint8 arrays of one size, with non-temporal stores."""
    _stream_bytes(src, dst)
    return dst


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``numpy.copyto(dst, src)`` of two flat C-contiguous arrays of one dtype and size, through
    ``stream_copy`` where numba is present (else ``copyto`` itself)."""
    if numba is None or dst.dtype != src.dtype or dst.shape != src.shape:
        np.copyto(dst, src)
        return
    stream_copy(src.view(np.uint8).reshape(-1), dst.view(np.uint8).reshape(-1))
