"""The tests' way to a real GPU: ``gpu()`` returns cupy where cupy imports and a device runs a
kernel, and skips the test with the reason otherwise (every machine CI runs on: no GPU)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest


def gpu() -> Any:
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("cupy sees no GPU")
        cupy.zeros(1).sum().item()
    except Exception as exc:  # no driver, no device, a device that cannot run
        pytest.skip(f"no usable GPU: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
    return cupy


def torch_cuda() -> Any:
    """torch with a CUDA device (and cupy beside it, which trainer_core lends CUDA tensors to)."""
    gpu()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def same_bits(a: Any, b: Any) -> bool:
    """Same dtype, shape and bytes (host arrays)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
