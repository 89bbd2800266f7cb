"""torch tensors as the arrays trainer_core's collectives and KV store take, without copies where
the memory allows it.

A contiguous CPU tensor is lent as a numpy view of its own memory (``Tensor.numpy()``): a result
written into that view lands in the tensor. bfloat16 (which numpy lacks) is lent as its raw bits, a
``uint16`` view, reduced with ``kind="bfloat16"``. A CUDA tensor is lent to cupy through DLPack (the
same device memory), and a cupy array back to torch the same way. CI has no GPU, so that path is
tested on a GPU machine only: it passed on an NVIDIA H200 (2026-11-27, ``scripts/gpu-check.sh``:
``tests/trainer_core/test_gpu.py::test_cuda_tensors_are_lent_to_cupy_without_a_copy`` and the torch
jobs on CUDA of ``test_gpu_jobs.py``); its speed is unmeasured.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainer_core.xp import is_device_array

#: the floating dtypes trainer_core reduces (bfloat16 as uint16 bits)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def kind_of(t: torch.Tensor) -> str | None:
    """The ``kind`` argument of a reduction of ``t`` (``"bfloat16"``, else None: the numpy dtype)."""
    return "bfloat16" if t.dtype == torch.bfloat16 else None


def as_array(t: torch.Tensor) -> Any:
    """``t``'s memory as a numpy array (CPU) or a cupy array (CUDA), contiguous, no copy when ``t``
    already is (else a contiguous copy). bfloat16 comes as uint16 bits."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
        return _lend(t).view(np.uint16)
    if t.dtype == torch.bool:
        return _lend(t.view(torch.uint8))
    return _lend(t)


def _lend(t: torch.Tensor) -> Any:
    if t.device.type == "cpu":
        return t.numpy()
    if t.device.type == "cuda":  # pragma: no cover - needs a GPU and cupy (CI has none; ran on an H200)
        import cupy

        return cupy.from_dlpack(t)
    raise TypeError(f"trainer_core.torch takes CPU or CUDA tensors, not a tensor on {t.device}")


def as_tensor(array: Any, dtype: torch.dtype, shape: Any = None) -> torch.Tensor:
    """A tensor over ``array``'s memory (no copy) of ``dtype`` (bfloat16 from its uint16 bits,
    bool from bytes), reshaped to ``shape`` when given."""
    if not is_device_array(array):
        a = np.ascontiguousarray(array)  # numpy scalars too
        if dtype == torch.bfloat16:
            out = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        elif dtype == torch.bool:
            out = torch.from_numpy(a.view(np.uint8)).view(torch.bool)
        else:
            out = torch.from_numpy(a)
    else:  # pragma: no cover - a cupy array (GPU path: CI has no GPU; ran on an H200, test_gpu.py)
        out = torch.from_dlpack(array)
        if dtype == torch.bfloat16:
            out = out.view(torch.int16).view(torch.bfloat16)
        elif dtype == torch.bool:
            out = out.view(torch.bool)
    return out if shape is None else out.reshape(shape)


def check_dense(t: torch.Tensor, what: str) -> None:
    """A clear error for the tensors trainer_core does not move: sparse or on another device."""
    if t.is_sparse or t.layout != torch.strided:
        raise ValueError(
            f"{what} is a sparse tensor ({t.layout}): trainer_core.torch reduces dense tensors only; "
            "use a dense gradient (e.g. nn.Embedding(sparse=False)) or DistributedOptimizer(sparse_as_dense=True)"
        )
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{what} is on {t.device}: trainer_core.torch takes CPU or CUDA tensors")
