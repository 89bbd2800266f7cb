"""The array module: numpy, or cupy on a GPU. The one place where arrays change device.

Kernels are written once against the module returned by ``array_module(x)`` so the same
code runs on numpy and on cupy. cupy is an optional extra (``pip install launchkit[gpu]``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import sys
from types import ModuleType
from typing import Any

import numpy as np

from trainer_core.log import LOGGER_NAME

_DRIVER = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}  # the CUDA driver's library


def _load_cupy() -> Any:
    """cupy when it is installed and usable, else None. Not installed: quietly None (the gpu
    extra is optional). Installed but broken (its import fails, or the CUDA driver it needs
    cannot be loaded): None, with one warning that names the error, so that a GPU job never
    drops to the CPU unsaid. The driver check only loads the library: it does not initialise
    CUDA, which would cost every process time and break CUDA in children forked later."""
    try:  # optional: present only with the gpu extra
        cupy = importlib.import_module("cupy")
    except ModuleNotFoundError as exc:
        if exc.name == "cupy":
            return None  # not installed
        return _broken(exc)
    except Exception as exc:
        return _broken(exc)
    hip = getattr(getattr(getattr(cupy, "cuda", None), "runtime", None), "is_hip", False)
    driver = _DRIVER.get(sys.platform)
    if driver is not None and not hip:
        try:
            ctypes.CDLL(driver)
        except OSError as exc:
            return _broken(exc)
    return cupy


def _broken(exc: BaseException) -> None:
    logging.getLogger(LOGGER_NAME).warning(
        "trainer_core: cupy is installed but cannot be used (%s: %s); arrays stay on the CPU (numpy)",
        type(exc).__name__,
        str(exc).strip().splitlines()[0] if str(exc).strip() else "no message",
    )


_cupy: Any = _load_cupy()


def array_module(x: Any) -> ModuleType:
    """numpy for host arrays, cupy for device arrays."""
    if _cupy is not None and isinstance(x, _cupy.ndarray):
        return _cupy
    return np


def cupy_module() -> Any | None:
    """cupy when it is installed and usable here, else ``None``."""
    return _cupy


def is_device_array(x: Any) -> bool:
    return _cupy is not None and isinstance(x, _cupy.ndarray)


def to_host(x: Any) -> np.ndarray:
    """A numpy view or copy of ``x`` (a device array is copied to host memory, once, here)."""
    if is_device_array(x):
        return _cupy.asnumpy(x)
    return np.asarray(x)


def like(host: np.ndarray, template: Any) -> Any:
    """``host`` moved to the device of ``template`` (numpy stays numpy)."""
    if is_device_array(template):
        return _cupy.asarray(host)
    return host


def host_to_device(host: np.ndarray, out: Any) -> None:
    """Host values copied once, straight into the C-contiguous device array ``out`` of their dtype
    and size (cupy's ``set``: no temporary on either side)."""
    src = np.ascontiguousarray(host).reshape(out.shape)
    with out.device:
        out.set(src)


def flat_sum(values: list[Any], dtype: np.dtype | None = None, device: bool = False) -> Any:
    """The sum of one key's values as one flat array of ``dtype``: on the device when ``device``
    and every value is an array on one device (a compressed push: only the payload leaves the
    device), else on the host (each device array copied once, by ``to_host``)."""
    if device and all(is_device_array(v) and v.device == values[0].device for v in values):
        total = values[0] if len(values) == 1 else values[0].copy()
        for v in values[1:]:
            total += v
    else:
        first = to_host(values[0])
        total = first if len(values) == 1 else sum((to_host(v) for v in values[1:]), start=first.copy())
        total = np.asarray(total)
    if dtype is not None and total.dtype != dtype:
        total = total.astype(dtype)
    return total.reshape(-1)


def pinned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` of page-locked host memory from cupy's pinned pool (freed memory is reused by the
    next call of about that size), or of ordinary memory where that fails."""
    try:
        import cupyx

        return cupyx.empty_pinned(nbytes, dtype=np.uint8)
    except Exception:  # no cupyx, or no pinned memory to be had: a pageable copy still works
        return np.empty(nbytes, dtype=np.uint8)


def payload_to_host(x: Any) -> np.ndarray:
    """A compressed payload as a flat host ``uint8`` array: a device array is copied once, at its
    own size, into page-locked memory (``pinned_empty``); a host array is viewed, not copied."""
    if not is_device_array(x):
        return np.ascontiguousarray(x).view(np.uint8).reshape(-1)
    flat = x.reshape(-1).view(np.uint8)
    host = pinned_empty(flat.nbytes)
    if flat.nbytes:
        flat.get(out=host)
    return host


def payload_to_device(x: Any, like: Any) -> Any:
    """A host payload (flat ``uint8``) copied once to the device of ``like``, into a fresh (aligned)
    device array; a device payload that is suitably aligned is used as it is."""
    if is_device_array(x):
        return x if x.data.ptr % 8 == 0 else x.copy()
    host = np.ascontiguousarray(x).view(np.uint8).reshape(-1)
    device = getattr(like, "device", None)  # cupy's Device is a context manager
    with device if device is not None else contextlib.nullcontext():
        return _cupy.asarray(host)
