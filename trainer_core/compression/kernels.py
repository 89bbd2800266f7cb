"""Which kernels run (compiled numba, or numpy and why), said once per process, and the compiled
ones made ready ahead of time, once per machine.

numba is a regular dependency where it has a wheel (pyproject.toml), so the compiled kernels run
by default; the numpy kernels are the fallback (no numba, float16, ``kernel='numpy'``). cupy
arrays take the CUDA kernels of ``_cuda.py`` (``cuda()``; compiled on first use, cached on disk by
cupy), and the array-module kernels, on the device, when those cannot be compiled (one WARNING).
The first time a process uses compression, one line on the ``trainer_core.compression`` logger
says which (INFO; WARNING for the numpy fallback): shown on stderr unless the application set up
logging, then through its handlers.

numba compiles a kernel on its first call and caches the machine code on disk (``cache=True``):
next to the source, or, on a read-only install, in the user's cache directory (numba's own
fallback; ``NUMBA_CACHE_DIR`` overrides both). ``warm(params)`` runs the kernels of a compression
type once on a small array, so that compiling (seconds) or loading from the cache (a fraction
of a second) happens when compression is set up (``set_gradient_compression`` on a worker, a
server receiving the setting), not inside the first push. It holds a file lock in the cache's
place meanwhile: of the processes of one machine warming at once, one compiles and writes the
cache, the others wait and then load it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import trainer_core.xp as arrays

LOGGER_NAME = "trainer_core.compression"
#: the compression types that have numba kernels
COMPILED = frozenset({"2bit", "1bit", "topk"})
#: a host array written of at least this many bytes, not read again at once, is written with
#: non-temporal stores (``_fast_stream``): larger than a core's cache, it would leave it anyway
STREAM_BYTES = 4 << 20

_state_lock = threading.Lock()
_announced = False
_warming = 0  # warms in progress: their own line says which kernels run
_warmed: set[str] = set()


def logger() -> logging.Logger:
    """The logger of the kernel line: INFO and above, on stderr unless logging is set up."""
    log = logging.getLogger(LOGGER_NAME)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s %(process)d] %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    return log


def describe() -> str:
    """Which kernels run for float32/float64 host arrays, in words."""
    from . import _fast

    if _fast.numba is None:
        return f"numpy kernels (numba cannot be imported: {_fast.IMPORT_ERROR}; pip install numba)"
    where = "on-disk cache" if _fast.CACHE_ERROR is None else f"no cache: {_fast.CACHE_ERROR}"
    return f"compiled numba {_fast.numba.__version__} kernels ({where})"


def announce(detail: str = "") -> None:
    """Log which kernels run, once per process (``detail`` is appended to that line)."""
    global _announced
    with _state_lock:
        if _announced:
            return
        _announced = True
    from . import _fast

    level = logging.INFO if _fast.available() else logging.WARNING
    logger().log(level, "trainer_core compression: %s%s", describe(), f"; {detail}" if detail else "")


def lock_path() -> Path:
    """The machine-wide lock file of ``warm`` (per user; beside ``NUMBA_CACHE_DIR`` when set)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    base = os.environ.get("NUMBA_CACHE_DIR") or tempfile.gettempdir()
    return Path(base) / f"trainer_core-kernels-{uid}.lock"


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Exclusive between the processes of this machine (no lock where ``fcntl`` or the file is missing)."""
    try:
        import fcntl

        path = lock_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def compile_counts() -> tuple[int, int]:
    """(signatures compiled, signatures loaded from the cache) over every numba kernel so far."""
    from . import _fast

    compiled = loaded = 0
    for kernel in _fast.kernels():
        stats = kernel.stats
        compiled += sum(stats.cache_misses.values())
        loaded += sum(stats.cache_hits.values())
    if _fast.CACHE_ERROR is not None:  # no cache: every signature was compiled
        compiled = sum(len(k.signatures) for k in _fast.kernels())
    return compiled, loaded


def warm(params: Mapping[str, Any] | None) -> None:
    """Compile, or load from the cache, the float32 kernels that compression ``params`` uses
    (once per type per process, under ``machine_lock``), and announce which kernels run."""
    from . import get_compressor

    kind = None if params is None else params.get("type")
    if not isinstance(kind, str) or kind == "none":
        return
    from . import _fast

    comp = get_compressor(dict(params))  # type: ignore[arg-type]
    if kind not in COMPILED or comp.kernel == "numpy" or not _fast.available():
        announce()
        return
    with _state_lock:
        if kind in _warmed:
            return
        _warmed.add(kind)
    global _warming
    _warming += 1
    try:
        # without a cache every process compiles anyway: waiting for the others would only add up
        with machine_lock() if _fast.CACHE_ERROR is None else contextlib.nullcontext():
            before = compile_counts()
            g = np.linspace(-1.0, 1.0, 4099, dtype=np.float32)
            t = time.perf_counter()
            payload, meta = comp.encode(g)
            comp.decode(payload, meta, g.shape, g.dtype, out=np.empty_like(g))
            comp.decode_sum([(payload, meta)] * 2, g.size, g.dtype, np.empty_like(g))
            if comp.encodes_sum(g):
                comp.encode(g, plus=g)
            if comp.encodes_payload_sum([(payload, meta)] * 2, g.dtype):
                get_compressor(dict(params)).encode_payload_sum([(payload, meta)] * 2, g.size, g.dtype, 2)  # type: ignore[arg-type]
            _warm_streaming(kind, payload, meta, g)
            took = time.perf_counter() - t
    finally:
        _warming -= 1
    compiled, loaded = (a - b for a, b in zip(compile_counts(), before, strict=True))
    how = f"compiled {compiled}" if compiled else f"loaded {loaded} from the cache"
    detail = f"{kind} kernels ready in {took:.2f} s ({how})"
    if _announced:
        logger().debug("trainer_core compression: %s", detail)
    announce(detail)


def _warm_streaming(kind: str, payload: Any, meta: Mapping[str, Any], g: np.ndarray) -> None:
    """The 1-bit kernels that only arrays of ``STREAM_BYTES`` run (the decoding into a large
    ``out``, and ``copy_streaming``, which the compressed allreduce's host uses), run once on ``g``."""
    if kind != "1bit":
        return
    from . import _fast_onebit, _fast_stream

    _fast_stream.stream_copy(g.view(np.uint8), np.empty(g.nbytes, np.uint8))
    nblocks = -(-g.size // int(meta["block_size"]))
    body = np.asarray(payload)
    vals, bits = body[: 8 * nblocks].view(np.float32), body[8 * nblocks :]
    _fast_onebit.onebit_decode_stream(vals, bits, int(meta["block_size"]), np.empty_like(g))


_cuda_built: dict[str, Any] = {}  # dtype name -> the CUDA kernels, or None: they cannot be compiled
_cuda_warned = False


def cuda(kernel: str, x: Any, dtype: Any) -> Any:
    """The CUDA kernels (``_cuda.Kernels``) for device array ``x`` of gradient ``dtype``, compiled on
    first use; ``None`` for host arrays, ``kernel='numpy'``, or kernels that cannot be compiled
    (then the array-module kernels run on the device, said once per process in a WARNING)."""
    if kernel == "numpy" or not arrays.is_device_array(x):
        return None
    name = np.dtype(dtype).name
    with _state_lock:
        if name not in _cuda_built:
            _cuda_built[name] = _compile_cuda(name)
        return _cuda_built[name]


def _compile_cuda(name: str) -> Any:
    global _cuda_warned
    from . import _cuda

    try:
        built = _cuda.compile_cupy(np.dtype(name))
    except Exception as exc:  # NVRTC, the driver, or cupy itself: any of them means "not here"
        first = (str(exc).strip().splitlines() or ["no message"])[0]
        level = logging.DEBUG if _cuda_warned else logging.WARNING
        _cuda_warned = True
        logger().log(
            level,
            "trainer_core compression: CUDA kernels cannot be compiled for %s (%s: %s); cupy arrays "
            "use the array-module kernels",
            name,
            type(exc).__name__,
            first,
        )
        return None
    said = any(k is not None for k in _cuda_built.values())
    version = getattr(arrays.cupy_module(), "__version__", "?")  # the module in use (a stand-in in tests)
    logger().log(
        logging.DEBUG if said else logging.INFO,
        "trainer_core compression: CUDA kernels for cupy arrays (cupy %s; %s ready)",
        version,
        name,
    )
    return built


def device_payload(buf: Any, out: Any) -> Any:
    """``buf`` on the device of ``out`` when ``out`` is a device array (copied there once, at the
    payload's size), else ``buf`` as it is: a payload is unpacked where its output lives."""
    return arrays.payload_to_device(buf, out) if arrays.is_device_array(out) else buf


def _reset_for_tests() -> None:
    """Forget what this process announced and warmed."""
    global _announced
    with _state_lock:
        _announced = False
        _warmed.clear()


__all__ = ["announce", "describe", "lock_path", "machine_lock", "warm"]


def copy_streaming(dst: np.ndarray, src: np.ndarray) -> None:
    """``numpy.copyto(dst, src)``; for two flat C-contiguous host arrays of one dtype and size of
    at least ``STREAM_BYTES``, with non-temporal stores where numba is present (``_fast_stream``:
    for a copy that is not read again at once, e.g. into another process's shared memory)."""
    from . import _fast

    if (
        not _fast.available()
        or src.nbytes < STREAM_BYTES
        or dst.dtype != src.dtype
        or dst.shape != src.shape
        or not (dst.flags.c_contiguous and src.flags.c_contiguous)
        or not isinstance(dst, np.ndarray)
        or not isinstance(src, np.ndarray)
    ):
        np.copyto(dst, src)
        return
    from . import _fast_stream

    _fast_stream.stream_copy(src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8))
