"""The array module: numpy, or cupy on a GPU. The one place where arrays change device.

Kernels are written once against the module returned by ``array_module(x)`` so the same
code runs on numpy and on cupy. cupy is an optional extra (``pip install launchkit[gpu]``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np


def _load_cupy() -> Any:
    try:  # optional: present only with the gpu extra
        return importlib.import_module("cupy")
    except Exception:  # pragma: no cover - depends on the machine
        return None


_cupy: Any = _load_cupy()


def array_module(x: Any) -> ModuleType:
    """numpy for host arrays, cupy for device arrays."""
    if _cupy is not None and isinstance(x, _cupy.ndarray):
        return _cupy
    return np


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
